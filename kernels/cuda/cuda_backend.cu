/*
 * kernels/cuda/cuda_backend.cu — the CUDA backend: creation, device memory,
 * host<->device copies, the staging ring and the function table.
 *
 * Memory: alloc() is a plain cudaMalloc (256-byte aligned by the driver),
 * zeroed before it returns; no managed memory. upload() and download() go
 * through the backend's stream and wait for it, so the host buffer may be
 * reused as soon as they return. Host buffers are pageable; a pinned host
 * pool for the KV tier-1 copies (and overlap of those copies with compute on
 * a second stream) is a later step, see docs/cuda.md.
 *
 * Argument rules are the CPU backend's (kernels/cpu/cpu_backend.c): NULL
 * pointers and non-positive sizes are CAIRN_EINVAL, a copy of 0 bytes is a
 * no-op.
 */
#include <dlfcn.h>
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/cuda/cuda_impl.h"

/* First size of the staging ring; a decode step of a few hundred sequences
 * stages a few tens of KB (page tables dominate), so wraps are rare. */
#define STAGE_INITIAL_BYTES ((size_t)4 << 20)

int cuda_fail(const char *what, cudaError_t err)
{
    cudaGetLastError(); /* reported here: not a later kernel's failure */
    cairn_log(CAIRN_LOG_ERROR, "cuda: %s failed: %s", what, cudaGetErrorString(err));
    return CAIRN_EBACKEND;
}

/* ---- cuBLAS, loaded at run time ------------------------------------------------ */

cuda_blas_api cuda_blas;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static int blas_status = CAIRN_EUNSUPPORTED;

#define CAIRN_STR2(x) #x
#define CAIRN_STR(x) CAIRN_STR2(x)

/* Where cuBLAS may live, in the order tried. The runtime is linked
 * statically, so cuBLAS is the only CUDA library found at run time, and GPU
 * images put it in different places: the toolkit (/usr/local/cuda*), the
 * loader's path, or only inside a PyTorch wheel (site-packages/nvidia/...).
 * The list is bounded; every entry is logged when none loads. */
#define BLAS_MAX_CANDIDATES 96
#define BLAS_SONAME "libcublas.so." CAIRN_STR(CUBLAS_VER_MAJOR)

typedef struct {
    char *path[BLAS_MAX_CANDIDATES];
    int n;
} blas_candidates;

static void blas_add(blas_candidates *c, const char *dir, const char *file)
{
    if (c->n >= BLAS_MAX_CANDIDATES || (dir && !dir[0]))
        return;
    char buf[4096];
    const int len = dir ? snprintf(buf, sizeof buf, "%s/%s", dir, file)
                        : snprintf(buf, sizeof buf, "%s", file);
    if (len <= 0 || (size_t)len >= sizeof buf)
        return;
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->path[i], buf) == 0)
            return;
    char *copy = strdup(buf);
    if (copy)
        c->path[c->n++] = copy;
}

/* The soname in every directory matching `pattern` (a glob). */
static void blas_add_glob(blas_candidates *c, const char *pattern)
{
    glob_t g;
    if (glob(pattern, GLOB_ONLYDIR, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++)
            blas_add(c, g.gl_pathv[i], BLAS_SONAME);
    globfree(&g);
}

/* Python's nvidia wheels below one lib/ prefix (a glob): nvidia/cu13/lib is
 * where the CUDA 13 wheels that PyTorch depends on put cuBLAS, and
 * nvidia/cublas/lib the per-library layout of the older wheels. */
static void blas_add_python(blas_candidates *c, const char *prefix)
{
    static const char *const sub[] = {"nvidia/cu13/lib", "nvidia/cublas/lib"};
    static const char *const kind[] = {"site-packages", "dist-packages"};
    for (size_t k = 0; k < 2; k++)
        for (size_t s = 0; s < 2; s++) {
            char pattern[2048];
            if (snprintf(pattern, sizeof pattern, "%s/python3*/%s/%s", prefix, kind[k], sub[s]) <
                (int)sizeof pattern)
                blas_add_glob(c, pattern);
        }
}

static void blas_collect(blas_candidates *c)
{
    /* 1. CAIRN_CUBLAS_PATH: the library itself, or its directory */
    const char *forced = getenv("CAIRN_CUBLAS_PATH");
    if (forced && forced[0]) {
        struct stat st;
        if (stat(forced, &st) == 0 && S_ISDIR(st.st_mode))
            blas_add(c, forced, BLAS_SONAME);
        else
            blas_add(c, NULL, forced);
    }
    /* 2. the soname, as the loader resolves it (ld.so.cache, LD_LIBRARY_PATH) */
    blas_add(c, NULL, BLAS_SONAME);
    /* 3. each LD_LIBRARY_PATH entry by full path (also when set after start) */
    const char *llp = getenv("LD_LIBRARY_PATH");
    if (llp) {
        char dir[2048];
        for (const char *p = llp; *p;) {
            const char *colon = strchr(p, ':');
            const size_t len = colon ? (size_t)(colon - p) : strlen(p);
            if (len > 0 && len < sizeof dir) {
                memcpy(dir, p, len);
                dir[len] = '\0';
                blas_add(c, dir, BLAS_SONAME);
            }
            if (!colon)
                break;
            p = colon + 1;
        }
    }
    /* 4. the toolkit cairn was built against, then any toolkit installed */
#ifdef CAIRN_CUDA_LIBDIR
    blas_add(c, CAIRN_CUDA_LIBDIR, BLAS_SONAME);
#endif
    blas_add_glob(c, "/usr/local/cuda*/lib64");
    blas_add_glob(c, "/usr/local/cuda*/lib");
    blas_add_glob(c, "/usr/local/cuda*/targets/x86_64-linux/lib");
    /* 5. Python wheels: system, /usr/local, the user's site dir and pyenv
     * versions, an active virtualenv or conda environment */
    blas_add_python(c, "/usr/lib");
    blas_add_python(c, "/usr/local/lib");
    static const struct {
        const char *env, *suffix;
    } prefixes[] = {
        {"HOME", "/.local/lib"},
        {"HOME", "/.pyenv/versions/*/lib"},
        {"VIRTUAL_ENV", "/lib"},
        {"CONDA_PREFIX", "/lib"},
    };
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        const char *root = getenv(prefixes[i].env);
        char prefix[2048];
        if (root && root[0] &&
            snprintf(prefix, sizeof prefix, "%s%s", root, prefixes[i].suffix) < (int)sizeof prefix)
            blas_add_python(c, prefix);
    }
    /* 6. an unversioned development symlink, last */
    blas_add(c, NULL, "libcublas.so");
}

static void blas_load_once(void)
{
    blas_candidates cand;
    cand.n = 0;
    blas_collect(&cand);
    void *lib = NULL;
    int loaded = -1;
    /* The error worth showing: that of a file that exists but would not
     * load (a missing libcublasLt, say), else the first one. */
    char why[512] = "";
    int why_is_real_file = 0;
    for (int i = 0; !lib && i < cand.n; i++) {
        lib = dlopen(cand.path[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            loaded = i;
            break;
        }
        const char *e = dlerror();
        const int real_file = strchr(cand.path[i], '/') && access(cand.path[i], F_OK) == 0;
        if (!why[0] || (real_file && !why_is_real_file)) {
            snprintf(why, sizeof why, "%s", e ? e : "unknown error");
            why_is_real_file = real_file;
        }
    }
    if (!lib) {
        /* every place tried, so the fix (CAIRN_CUBLAS_PATH) is obvious */
        size_t len = 0;
        char tried[8192];
        tried[0] = '\0';
        for (int i = 0; i < cand.n && len + 1 < sizeof tried; i++) {
            const int w = snprintf(tried + len, sizeof tried - len, "%s%s", i ? ", " : "",
                                   cand.path[i]);
            if (w < 0)
                break;
            len += (size_t)w;
        }
        cairn_log(CAIRN_LOG_ERROR,
                  "cuda: cannot load cuBLAS (%s): %s; tried %d places: %s. Set "
                  "CAIRN_CUBLAS_PATH to the library or its directory",
                  BLAS_SONAME, why, cand.n, tried);
    } else {
        cairn_log(CAIRN_LOG_DEBUG, "cuda: cuBLAS loaded from %s", cand.path[loaded]);
    }
    for (int i = 0; i < cand.n; i++)
        free(cand.path[i]);
    if (!lib)
        return;
    cuda_blas_api api;
#define BLAS_SYM(field, symbol)                                                                    \
    api.field = (decltype(api.field))dlsym(lib, #symbol);                                          \
    if (!api.field) {                                                                              \
        cairn_log(CAIRN_LOG_ERROR, "cuda: cuBLAS has no %s", #symbol);                             \
        return;                                                                                    \
    }
    BLAS_SYM(create, cublasCreate_v2)
    BLAS_SYM(destroy, cublasDestroy_v2)
    BLAS_SYM(set_stream, cublasSetStream_v2)
    BLAS_SYM(set_math_mode, cublasSetMathMode)
    BLAS_SYM(sgemm, cublasSgemm_v2)
    BLAS_SYM(gemm_ex, cublasGemmEx)
#undef BLAS_SYM
    /* optional: only step graphs need it */
    api.set_workspace = (decltype(api.set_workspace))dlsym(lib, "cublasSetWorkspace_v2");
    cuda_blas = api; /* the library stays loaded for the process's life */
    blas_status = CAIRN_OK;
}

int cuda_blas_load(void)
{
    pthread_once(&blas_once, blas_load_once);
    return blas_status;
}

/* CAIRN_CUDA_SYNC=1: wait after every kernel (debugging; see cuda_impl.h). */
static int debug_sync;

int cuda_debug_sync(void) { return debug_sync; }

/* Kernel launches by name, for tests that must show which path ran
 * (cairn_backend_cuda_launches). Keyed by the string literal each
 * CUDA_LAUNCHED site passes, so the common case is a few pointer compares;
 * a name first seen takes the lock once. Process-wide: every CUDA backend
 * of the process together. */
enum { LAUNCH_SITES = 128 };
static struct {
    const char *what; /* NULL: free; set once, never changed */
    uint64_t n;
} launch_counts[LAUNCH_SITES];
static pthread_mutex_t launch_counts_lock = PTHREAD_MUTEX_INITIALIZER;

static void count_launch(const char *what)
{
    for (int i = 0; i < LAUNCH_SITES; i++) {
        const char *w = __atomic_load_n(&launch_counts[i].what, __ATOMIC_ACQUIRE);
        if (w == what) {
            __atomic_fetch_add(&launch_counts[i].n, 1, __ATOMIC_RELAXED);
            return;
        }
        if (!w)
            break;
    }
    pthread_mutex_lock(&launch_counts_lock);
    for (int i = 0; i < LAUNCH_SITES; i++) {
        const char *w = launch_counts[i].what;
        if (w == what || !w) {
            __atomic_fetch_add(&launch_counts[i].n, 1, __ATOMIC_RELAXED);
            if (!w)
                __atomic_store_n(&launch_counts[i].what, what, __ATOMIC_RELEASE);
            break;
        }
    } /* a full table counts no more sites: only tests read it */
    pthread_mutex_unlock(&launch_counts_lock);
}

extern "C" int cairn_backend_cuda_launches(const cairn_backend *be, const char *kernel,
                                           uint64_t *n)
{
    if (!be || !kernel || !n || !be->iface || strcmp(be->iface->name, "cuda") != 0)
        return CAIRN_EUNSUPPORTED;
    uint64_t sum = 0;
    for (int i = 0; i < LAUNCH_SITES; i++) {
        const char *w = __atomic_load_n(&launch_counts[i].what, __ATOMIC_ACQUIRE);
        if (!w)
            break;
        if (strcmp(w, kernel) == 0)
            sum += __atomic_load_n(&launch_counts[i].n, __ATOMIC_RELAXED);
    }
    *n = sum;
    return CAIRN_OK;
}

int cuda_launched(const char *what)
{
    count_launch(what);
    /* Only this launch's error can be here: cuda_enter cleared what came
     * before the op, and every call since was checked where it was made. */
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && debug_sync)
        e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        cairn_log(CAIRN_LOG_ERROR, "cuda: kernel %s failed: %s", what, cudaGetErrorString(e));
        return CAIRN_EBACKEND;
    }
    return CAIRN_OK;
}

static int cublas_fail(const char *what, cublasStatus_t st)
{
    cairn_log(CAIRN_LOG_ERROR, "cuda: %s failed: cuBLAS status %d", what, (int)st);
    return CAIRN_EBACKEND;
}

int cuda_enter(cairn_backend *be)
{
    if (!be || !be->ctx)
        return CAIRN_EINVAL;
    CUDA_TRY(cudaSetDevice(cuda_ctx_of(be)->device));
    /* The runtime keeps the last unsuccessful return of any call as the
     * thread's last error, and CUDA_LAUNCHED reads it to learn whether a
     * launch failed. Whatever is there now was already returned to its own
     * caller or deliberately let go (a fence poll's cudaErrorNotReady, a
     * free during teardown): left in place, it would fail this op's first
     * kernel ("kernel get_rows failed: device not ready"). Cleared at every
     * entry, a kernel is blamed only for its own launch. A sticky error (a
     * context that faulted) survives this and fails the next call anyway. */
    cudaGetLastError();
    return CAIRN_OK;
}

int cuda_type_supported(cairn_type type)
{
    switch (type) {
    case CAIRN_TYPE_F32:
    case CAIRN_TYPE_F16:
    case CAIRN_TYPE_BF16:
    case CAIRN_TYPE_Q8_0:
    case CAIRN_TYPE_Q4_0:
    case CAIRN_TYPE_Q5_0:
    case CAIRN_TYPE_Q4_K:
    case CAIRN_TYPE_Q5_K:
    case CAIRN_TYPE_Q6_K:
    case CAIRN_TYPE_Q4_Z:
    case CAIRN_TYPE_F8_E4M3:
    case CAIRN_TYPE_MXFP4:
        return 1;
    default:
        return 0;
    }
}

size_t cuda_row_bytes(cairn_type type, int64_t n)
{
    return cairn_type_row_bytes(type, n);
}

/* ---- staging ring ----------------------------------------------------------- */

static void stage_release(cuda_ctx *ctx)
{
    if (ctx->stage_host)
        cudaFreeHost(ctx->stage_host);
    if (ctx->stage_dev)
        cudaFree(ctx->stage_dev);
    ctx->stage_host = NULL;
    ctx->stage_dev = NULL;
    ctx->stage_cap = ctx->stage_used = 0;
}

/* A failed allocation leaves the runtime's sticky last error set; clear it,
 * or the next CUDA_LAUNCHED would report a kernel failure that did not
 * happen. Out of memory is CAIRN_ENOMEM, anything else CAIRN_EBACKEND. */
static int alloc_failed(const char *what, cudaError_t e, size_t bytes)
{
    cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) {
        cairn_log(CAIRN_LOG_ERROR, "cuda: %s of %.1f MiB: out of memory", what,
                  (double)bytes / (1 << 20));
        return CAIRN_ENOMEM;
    }
    return cuda_fail(what, e);
}

static int stage_grow(cuda_ctx *ctx, size_t cap)
{
    /* The old ring may still be read by queued copies: drain first. */
    CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    stage_release(ctx);
    cudaError_t e = cudaHostAlloc((void **)&ctx->stage_host, cap, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        ctx->stage_host = NULL;
        return alloc_failed("cudaHostAlloc", e, cap);
    }
    e = cudaMalloc((void **)&ctx->stage_dev, cap);
    if (e != cudaSuccess) {
        ctx->stage_dev = NULL;
        stage_release(ctx);
        return alloc_failed("cudaMalloc", e, cap);
    }
    ctx->stage_cap = cap;
    ctx->stage_used = 0;
    cuda_stage_table_new_epoch(&ctx->stage_sent); /* a new ring: nothing sent before is in it */
    return CAIRN_OK;
}

int cuda_stage_room(cuda_ctx *ctx, size_t room)
{
    if (ctx->stage_cap - ctx->stage_used >= room)
        return CAIRN_OK;
    if (room > ctx->stage_cap) { /* a new ring, empty */
        size_t cap = ctx->stage_cap ? ctx->stage_cap : STAGE_INITIAL_BYTES;
        while (cap < room)
            cap *= 2;
        return stage_grow(ctx, cap);
    }
    /* Wrap: everything queued so far (including the copies out of the
     * region about to be reused) must have finished. */
    CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    ctx->stage_used = 0;
    cuda_stage_table_new_epoch(&ctx->stage_sent); /* regions sent before are about to be reused */
    return CAIRN_OK;
}

int cuda_stage_reserve(cuda_ctx *ctx, size_t bytes, uint8_t **host, uint8_t **dev)
{
    const size_t need = (bytes + 15) / 16 * 16;
    if (need == 0 || need < bytes)
        return CAIRN_EINVAL;
    int rc = cuda_stage_room(ctx, need);
    if (rc != CAIRN_OK)
        return rc;
    *host = ctx->stage_host + ctx->stage_used;
    *dev = ctx->stage_dev + ctx->stage_used;
    ctx->stage_used += need;
    return CAIRN_OK;
}

int cuda_stage_send(cuda_ctx *ctx, uint8_t *host, uint8_t *dev, size_t bytes)
{
    CUDA_TRY(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    return CAIRN_OK;
}

int cuda_stage_commit(cuda_ctx *ctx, uint8_t *host, uint8_t **dev, size_t bytes)
{
    uint8_t *earlier = cuda_stage_table_find(&ctx->stage_sent, host, bytes);
    if (earlier) {
        /* the region just reserved goes back when it is the ring's last */
        const size_t need = (bytes + 15) / 16 * 16;
        if (host + need == ctx->stage_host + ctx->stage_used)
            ctx->stage_used -= need;
        *dev = earlier;
        return CAIRN_OK;
    }
    int rc = cuda_stage_send(ctx, host, *dev, bytes);
    if (rc != CAIRN_OK)
        return rc;
    cuda_stage_table_sent(&ctx->stage_sent, host, *dev, bytes);
    return CAIRN_OK;
}

int cuda_stage_copy(cuda_ctx *ctx, const void *src, size_t bytes, const void **dev)
{
    uint8_t *h, *d;
    int rc = cuda_stage_reserve(ctx, bytes, &h, &d);
    if (rc != CAIRN_OK)
        return rc;
    memcpy(h, src, bytes);
    rc = cuda_stage_commit(ctx, h, &d, bytes);
    if (rc == CAIRN_OK)
        *dev = d;
    return rc;
}

int cuda_scratch_reserve(cuda_ctx *ctx, size_t bytes, void **out)
{
    if (bytes > ctx->scratch_cap) {
        /* Kernels queued earlier may still use the old scratch. */
        CUDA_TRY(cudaStreamSynchronize(ctx->stream));
        if (ctx->scratch)
            cudaFree(ctx->scratch);
        ctx->scratch = NULL;
        ctx->scratch_cap = 0;
        size_t cap = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        cudaError_t e = cudaMalloc(&ctx->scratch, cap);
        if (e != cudaSuccess) {
            ctx->scratch = NULL;
            return alloc_failed("cudaMalloc (matmul scratch)", e, cap);
        }
        ctx->scratch_cap = cap;
    }
    *out = ctx->scratch;
    return CAIRN_OK;
}

/* ---- memory -------------------------------------------------------------------- */

static void cuda_destroy(cairn_backend *be)
{
    if (!be)
        return;
    cuda_ctx *ctx = cuda_ctx_of(be);
    if (ctx) {
        cudaSetDevice(ctx->device);
        if (ctx->stream)
            cudaStreamSynchronize(ctx->stream);
        /* cuBLAS first: the graphs own the workspace it was given, which
         * must outlive the handle that may use it */
        if (ctx->cublas)
            cuda_blas.destroy(ctx->cublas);
        ctx->cublas = NULL;
        cuda_graphs_free(ctx);
        cuda_transfers_free(ctx);
        stage_release(ctx);
        if (ctx->scratch)
            cudaFree(ctx->scratch);
        if (ctx->stream)
            cudaStreamDestroy(ctx->stream);
        free(ctx);
    }
    free(be);
}

static int cuda_alloc(cairn_backend *be, size_t bytes, void **out)
{
    if (!out || bytes == 0)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    if (bytes > SIZE_MAX - 64)
        return CAIRN_ENOMEM;
    /* Whole 64-byte lines, as the CPU backend: a kernel may read a padded
     * row tail. cudaMalloc itself aligns to 256 bytes. */
    const size_t rounded = (bytes + 63) / 64 * 64;
    void *mem = NULL;
    cudaError_t e = cudaMalloc(&mem, rounded);
    if (e != cudaSuccess)
        return alloc_failed("cudaMalloc", e, rounded);
    cuda_ctx *ctx = cuda_ctx_of(be);
    e = cudaMemsetAsync(mem, 0, rounded, ctx->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) {
        cudaFree(mem);
        return cuda_fail("cudaMemsetAsync", e);
    }
    *out = mem;
    return CAIRN_OK;
}

static void cuda_free(cairn_backend *be, void *ptr)
{
    if (!ptr || cuda_enter(be) != CAIRN_OK)
        return;
    /* Queued kernels may still read it. */
    cudaStreamSynchronize(cuda_ctx_of(be)->stream);
    cudaFree(ptr);
}

static int cuda_copy_kind(cairn_backend *be, void *dst, const void *src, size_t bytes,
                          cudaMemcpyKind kind, int wait)
{
    if (!dst || !src)
        return CAIRN_EINVAL;
    if (bytes == 0 || dst == src)
        return CAIRN_OK;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, ctx->stream));
    if (wait)
        CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    return CAIRN_OK;
}

static int cuda_upload(cairn_backend *be, void *dst, const void *host_src, size_t bytes)
{
    /* Waits: the caller may free or reuse host_src when this returns. */
    return cuda_copy_kind(be, dst, host_src, bytes, cudaMemcpyHostToDevice, 1);
}

static int cuda_download(cairn_backend *be, void *host_dst, const void *src, size_t bytes)
{
    return cuda_copy_kind(be, host_dst, src, bytes, cudaMemcpyDeviceToHost, 1);
}

static int cuda_copy(cairn_backend *be, void *dst, const void *src, size_t bytes)
{
    /* Device to device, ordered on the stream like any op. cudaMemcpyAsync
     * is undefined on overlapping ranges (the CPU's copy is memmove), so an
     * overlap is refused rather than copied wrongly; the engine copies whole
     * pages between distinct pages. dst == src stays a no-op. */
    if (dst && src && dst != src && bytes > 0) {
        const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
        if (d < s + bytes && s < d + bytes) {
            cairn_log(CAIRN_LOG_ERROR, "cuda: copy of %zu bytes between overlapping ranges",
                      bytes);
            return CAIRN_EINVAL;
        }
    }
    return cuda_copy_kind(be, dst, src, bytes, cudaMemcpyDeviceToDevice, 0);
}

static int cuda_supports_type(const cairn_backend *be, cairn_type t)
{
    (void)be;
    return cuda_type_supported(t);
}

static int cuda_synchronize(cairn_backend *be)
{
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    CUDA_TRY(cudaStreamSynchronize(cuda_ctx_of(be)->stream));
    return CAIRN_OK;
}

/* Filled field by field (C++ has no designated initializers before C++20),
 * so the order of backend.h's table does not matter here. */
static cairn_backend_iface cuda_iface;

static void cuda_iface_init(void)
{
    cuda_iface.name = "cuda";
    cuda_iface.destroy = cuda_destroy;
    cuda_iface.supports_type = cuda_supports_type;
    cuda_iface.alloc = cuda_alloc;
    cuda_iface.free = cuda_free;
    cuda_iface.upload = cuda_upload;
    cuda_iface.download = cuda_download;
    cuda_iface.copy = cuda_copy;
    cuda_iface.synchronize = cuda_synchronize;
    cuda_iface.get_rows = cuda_get_rows;
    cuda_iface.matmul = cuda_matmul;
    cuda_iface.matmul_invariant_rows = cuda_matmul_invariant_rows;
    cuda_iface.rmsnorm = cuda_rmsnorm;
    cuda_iface.rope = cuda_rope;
    cuda_iface.swiglu = cuda_swiglu;
    cuda_iface.geglu = cuda_geglu;
    cuda_iface.swiglu_clamped = cuda_swiglu_clamped;
    cuda_iface.gather_cols = cuda_gather_cols;
    cuda_iface.scale = cuda_scale;
    cuda_iface.add = cuda_add;
    cuda_iface.add_bias = cuda_add_bias;
    cuda_iface.add_rows_scaled = cuda_add_rows_scaled;
    cuda_iface.softmax = cuda_softmax;
    cuda_iface.kv_store = cuda_kv_store;
    cuda_iface.attention = cuda_attention;
    cuda_transfer_iface(&cuda_iface);
    cuda_graph_iface(&cuda_iface);
    cuda_iface.sample_rows = cuda_sample_rows;
}

extern "C" int cairn_backend_cuda_device_count(void)
{
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess)
        return count;
    cudaGetLastError();
    if (e == cudaErrorNoDevice)
        return 0;
    if (e == cudaErrorInsufficientDriver) {
        /* No driver at all is a machine without a GPU; a driver that is
         * there but too old for this runtime is a broken GPU machine. */
        void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!driver)
            return 0;
        dlclose(driver);
    }
    cairn_log(CAIRN_LOG_ERROR, "cuda: cudaGetDeviceCount failed: %s", cudaGetErrorString(e));
    return CAIRN_EBACKEND;
}

extern "C" int cairn_backend_cuda_create(int device, cairn_backend **out)
{
    if (!out || device < 0)
        return CAIRN_EINVAL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        /* DEBUG: callers probing for a GPU (--device auto) fall back to the
         * CPU quietly; those that insisted report the failure themselves. */
        cairn_log(CAIRN_LOG_DEBUG, "cuda: no CUDA device available (%s)",
                  e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        cudaGetLastError();
        return CAIRN_EUNSUPPORTED;
    }
    if (device >= count) {
        cairn_log(CAIRN_LOG_ERROR, "cuda: device %d requested but only %d present", device, count);
        return CAIRN_EUNSUPPORTED;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return cuda_fail("cudaSetDevice", e);

    cairn_backend *be = (cairn_backend *)calloc(1, sizeof *be);
    cuda_ctx *ctx = (cuda_ctx *)calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        return CAIRN_ENOMEM;
    }
    cuda_iface_init();
    const char *sync_env = getenv("CAIRN_CUDA_SYNC");
    debug_sync = sync_env && strcmp(sync_env, "1") == 0;
    be->iface = &cuda_iface;
    be->ctx = ctx;
    ctx->device = device;
    int rc = CAIRN_OK;
    cublasStatus_t st;
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
        rc = cuda_fail("cudaGetDeviceProperties", e);
    } else if (prop.major < 8) {
        /* The kernels use bf16 conversions and are built for sm_80+ only. */
        cairn_log(CAIRN_LOG_ERROR,
                  "cuda: device %d (%s) is compute capability %d.%d; cairn "
                  "needs 8.0 or newer",
                  device, prop.name, prop.major, prop.minor);
        rc = CAIRN_EUNSUPPORTED;
    } else if ((rc = cuda_blas_load()) != CAIRN_OK) {
        /* logged by the loader */
    } else if ((e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) !=
               cudaSuccess) {
        ctx->stream = NULL;
        rc = cuda_fail("cudaStreamCreate", e);
    } else if ((st = cuda_blas.create(&ctx->cublas)) != CUBLAS_STATUS_SUCCESS) {
        ctx->cublas = NULL;
        rc = cublas_fail("cublasCreate", st);
    } else if ((st = cuda_blas.set_stream(ctx->cublas, ctx->stream)) != CUBLAS_STATUS_SUCCESS) {
        rc = cublas_fail("cublasSetStream", st);
    } else if ((st = cuda_blas.set_math_mode(ctx->cublas, CUBLAS_DEFAULT_MATH)) !=
               CUBLAS_STATUS_SUCCESS) {
        /* DEFAULT_MATH: F32 GEMMs stay in full F32 (no TF32 down-conversion). */
        rc = cublas_fail("cublasSetMathMode", st);
    } else if ((rc = stage_grow(ctx, STAGE_INITIAL_BYTES)) == CAIRN_OK) {
        rc = cuda_graphs_init(ctx);
    }
    if (rc != CAIRN_OK) {
        cuda_destroy(be);
        return rc;
    }
    snprintf(ctx->name, sizeof ctx->name, "%s", prop.name);
    cairn_log(CAIRN_LOG_DEBUG, "cuda backend: device %d, %s, compute %d.%d, %.1f GiB", device,
              prop.name, prop.major, prop.minor, (double)prop.totalGlobalMem / (1 << 30));
    *out = be;
    return CAIRN_OK;
}
