/*
 * kernels/cuda/cuda_ops.cu — the small ops: embedding lookup (get_rows),
 * RMSNorm, RoPE, SwiGLU (plain and gpt-oss's clamped), GeGLU, add, add_bias,
 * softmax, and writing K/V into the paged pool.
 *
 * Each kernel is the CPU backend's loop (kernels/cpu/cpu_ops.c,
 * cpu_matmul.c, cpu_attention.c) with its iterations spread over threads;
 * the argument checks are the CPU's, in the same order, so both backends
 * reject the same calls. Reductions (RMSNorm, softmax) keep the CPU's double
 * sums; only their order of additions differs.
 */
#include <math.h>

#include "kernels/cuda/cuda_impl.h"

#define OPS_THREADS 256

/* Blocks for a grid-stride loop over n elements. */
static unsigned grid_for(size_t n)
{
    size_t blocks = (n + OPS_THREADS - 1) / OPS_THREADS;
    return (unsigned)(blocks > 65535 ? 65535 : blocks);
}

/* ---- block reductions (blockDim.x == OPS_THREADS) ------------------------- */

static __device__ double block_sum_double(double v, double *shared /* [32] */)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* shared may still be read by a previous reduction */
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < (int)(blockDim.x / 32); w++)
        total += shared[w];
    return total;
}

static __device__ float block_max_float(float v, float *shared /* [32] */)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x / 32); w++)
        m = fmaxf(m, shared[w]);
    return m;
}

/* ---- get_rows -------------------------------------------------------------- */

/* Block t: row ids[t]. Plain types element by element; quantized ones one
 * 32-element block per thread. */
static __global__ void get_rows_kernel(float *out, const uint8_t *table, int type, int D,
                                       size_t row_bytes, const int32_t *ids)
{
    const int t = blockIdx.x;
    const uint8_t *row = table + (size_t)ids[t] * row_bytes;
    float *dst = out + (size_t)t * D;
    if (type == CAIRN_TYPE_F32) {
        for (int i = threadIdx.x; i < D; i += blockDim.x)
            dst[i] = ((const float *)row)[i];
    } else if (type == CAIRN_TYPE_F16) {
        for (int i = threadIdx.x; i < D; i += blockDim.x)
            dst[i] = __half2float(((const __half *)row)[i]);
    } else if (type == CAIRN_TYPE_BF16) {
        for (int i = threadIdx.x; i < D; i += blockDim.x)
            dst[i] = __uint_as_float((unsigned)((const unsigned short *)row)[i] << 16);
    } else {
        float v[32];
        for (int b = threadIdx.x; b < D / 32; b += blockDim.x) {
            cu_dequant_block32(row, type, b, v);
            for (int j = 0; j < 32; j++)
                dst[32 * b + j] = v[j];
        }
    }
}

int cuda_get_rows(cairn_backend *be, float *out, const void *table, cairn_type type, int D,
                  const int32_t *ids, int T)
{
    if (!be || !out || !table || !ids || D <= 0 || T <= 0)
        return CAIRN_EINVAL;
    const cairn_type_traits *tt = cairn_type_get(type);
    if (!cuda_type_supported(type) || !tt || D % tt->block_elems != 0)
        return CAIRN_EINVAL;
    for (int t = 0; t < T; t++)
        if (ids[t] < 0)
            return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);
    const void *d_ids;
    if ((rc = cuda_stage_copy(ctx, ids, (size_t)T * sizeof(int32_t), &d_ids)) != CAIRN_OK)
        return rc;
    /* T <= max batch tokens, far below the grid's x limit (2^31 - 1) */
    get_rows_kernel<<<T, 128, 0, ctx->stream>>>(out, (const uint8_t *)table, (int)type, D,
                                                cuda_row_bytes(type, D), (const int32_t *)d_ids);
    CUDA_LAUNCHED("get_rows");
    return CAIRN_OK;
}

/* ---- rmsnorm ---------------------------------------------------------------- */

static __global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int D, float eps)
{
    __shared__ double red[32];
    const float *xr = x + (size_t)blockIdx.x * D;
    float *outr = out + (size_t)blockIdx.x * D;
    double sum = 0.0;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        sum += (double)__fmul_rn(xr[i], xr[i]);
    sum = block_sum_double(sum, red);
    const float mean = (float)(sum / D);
    const float scale = 1.0f / sqrtf(mean + eps);
    /* every thread has read its own x before writing its own out: aliasing
     * x == out is safe (the reduction's barriers order the reads first) */
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        outr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

int cuda_rmsnorm(cairn_backend *be, float *out, const float *x, const float *w, int T, int D,
                 float eps)
{
    if (!be || !out || !x || !w || T <= 0 || D <= 0 || !(eps >= 0.0f))
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    rmsnorm_kernel<<<T, OPS_THREADS, 0, cuda_ctx_of(be)->stream>>>(out, x, w, D, eps);
    CUDA_LAUNCHED("rmsnorm");
    return CAIRN_OK;
}

/* ---- rope ------------------------------------------------------------------- */

/* Block t: every head of token t. Thread 0 builds the angles with the CPU's
 * running product (theta *= theta_scale per pair, a sequential dependency
 * whose float rounding the CPU results carry), the others then rotate. */
static __global__ void rope_kernel(float *x, int n_heads, int head_dim, const int32_t *pos,
                                   int n_rot, int neox, float theta_scale, float freq_scale,
                                   const float *freq_factors)
{
    extern __shared__ float angle[]; /* [n_rot / 2] */
    const int t = blockIdx.x, half = n_rot / 2;
    if (threadIdx.x == 0) {
        float theta = (float)pos[t];
        for (int i = 0; i < half; i++) {
            const float factor = freq_factors ? freq_factors[i] : 1.0f;
            angle[i] = __fmul_rn(freq_scale, __fdiv_rn(theta, factor));
            theta = __fmul_rn(theta, theta_scale);
        }
    }
    __syncthreads();
    const int stride = neox ? 1 : 2, offset = neox ? half : 1;
    float *xt = x + (size_t)t * n_heads * head_dim;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        const int h = k / half, i = k % half;
        float *a = xt + (size_t)h * head_dim + (size_t)i * stride;
        float *b = a + offset;
        const float c = cosf(angle[i]), s = sinf(angle[i]);
        const float x0 = *a, x1 = *b;
        *a = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        *b = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    }
}

int cuda_rope(cairn_backend *be, float *x, int T, int n_heads, int head_dim, const int32_t *pos,
              const cairn_rope_params *p)
{
    if (!be || cairn_rope_args_check(x, T, n_heads, head_dim, pos, p) != CAIRN_OK)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);
    const void *d_pos;
    if ((rc = cuda_stage_copy(ctx, pos, (size_t)T * sizeof(int32_t), &d_pos)) != CAIRN_OK)
        return rc;
    /* the same host powf as the CPU backend, so theta_scale is identical */
    const float theta_scale = powf(p->freq_base, -2.0f / (float)p->n_rot);
    rope_kernel<<<T, 128, (size_t)(p->n_rot / 2) * sizeof(float), ctx->stream>>>(
        x, n_heads, head_dim, (const int32_t *)d_pos, p->n_rot, p->mode == CAIRN_ROPE_NEOX,
        theta_scale, p->freq_scale, p->freq_factors);
    CUDA_LAUNCHED("rope");
    return CAIRN_OK;
}

/* ---- swiglu, swiglu_clamped, geglu, add, add_bias ------------------------- */

static __global__ void swiglu_kernel(float *out, const float *g, const float *u, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g[i];
        out[i] = __fmul_rn(__fdiv_rn(gi, 1.0f + expf(-gi)), u[i]);
    }
}

static __global__ void geglu_kernel(float *out, const float *g, const float *u, size_t n)
{
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g[i];
        out[i] = 0.5f * gi * (1.0f + tanhf(c * (gi + 0.044715f * gi * gi * gi))) * u[i];
    }
}

/* gpt-oss's expert activation: the gate clamped from above only (a large
 * negative gate already gives ~0), the linear half both ways, and the
 * sigmoid sharpened by alpha; the + 1 on up is the model's, not a bias. */
static __global__ void swiglu_clamped_kernel(float *out, const float *g, const float *u, size_t n,
                                             float alpha, float limit)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        /* the CPU's comparisons, not fminf/fmaxf: a NaN up stays NaN (and a
         * NaN gate becomes limit) on both backends */
        const float gi = g[i] < limit ? g[i] : limit;
        const float ui = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
        /* each product and quotient rounded on its own, as in swiglu, so that
         * nvcc cannot fuse them into roundings the CPU does not make */
        out[i] = __fmul_rn(__fdiv_rn(gi, 1.0f + expf(__fmul_rn(-alpha, gi))), ui + 1.0f);
    }
}

static __global__ void scale_kernel(float *x, float s, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

static __global__ void gather_cols_kernel(float *out, const float *x, const int32_t *idx, int T,
                                          int n)
{
    const size_t total = (size_t)T * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / (size_t)n;
        out[i] = x[row * n + idx[i % (size_t)n]];
    }
}

static __global__ void add_kernel(float *y, const float *a, const float *b, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

static __global__ void add_bias_kernel(float *x, const float *bias, int T, int n)
{
    const size_t total = (size_t)T * n;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] += bias[i % (size_t)n];
}

typedef void (*binary_kernel_fn)(float *, const float *, const float *, size_t);

/* out[n] = f(a[n], b[n]) on the compute stream: the argument checks and the
 * launch the element-wise ops share. */
static int binary_launch(cairn_backend *be, binary_kernel_fn kernel, const char *what, float *out,
                         const float *a, const float *b, size_t n)
{
    if (!be || !out || !a || !b || n == 0 || n > (size_t)INT64_MAX)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    kernel<<<grid_for(n), OPS_THREADS, 0, cuda_ctx_of(be)->stream>>>(out, a, b, n);
    CUDA_LAUNCHED(what);
    return CAIRN_OK;
}

int cuda_swiglu(cairn_backend *be, float *out, const float *gate, const float *up, size_t n)
{
    return binary_launch(be, swiglu_kernel, "swiglu", out, gate, up, n);
}

int cuda_geglu(cairn_backend *be, float *out, const float *gate, const float *up, size_t n)
{
    return binary_launch(be, geglu_kernel, "geglu", out, gate, up, n);
}

int cuda_swiglu_clamped(cairn_backend *be, float *out, const float *gate, const float *up,
                        size_t n, float alpha, float limit)
{
    /* a NaN limit would let every value through the clamps unnoticed */
    if (!be || !out || !gate || !up || n == 0 || n > (size_t)INT64_MAX || !isfinite(alpha) ||
        !(limit > 0.0f))
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    swiglu_clamped_kernel<<<grid_for(n), OPS_THREADS, 0, cuda_ctx_of(be)->stream>>>(
        out, gate, up, n, alpha, limit);
    CUDA_LAUNCHED("swiglu_clamped");
    return CAIRN_OK;
}

int cuda_scale(cairn_backend *be, float *x, float s, size_t n)
{
    if (!be || !x || n == 0 || n > (size_t)INT64_MAX || !isfinite(s))
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    scale_kernel<<<grid_for(n), OPS_THREADS, 0, cuda_ctx_of(be)->stream>>>(x, s, n);
    CUDA_LAUNCHED("scale");
    return CAIRN_OK;
}

/* idx is device memory uploaded with the weights; its range was checked on
 * the host before upload (the model binds only checked permutations). */
int cuda_gather_cols(cairn_backend *be, float *out, const float *x, const int32_t *idx, int T,
                     int n)
{
    if (!be || !out || !x || !idx || T <= 0 || n <= 0)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    const size_t total = (size_t)T * n;
    gather_cols_kernel<<<grid_for(total), OPS_THREADS, 0, cuda_ctx_of(be)->stream>>>(out, x, idx,
                                                                                   T, n);
    CUDA_LAUNCHED("gather_cols");
    return CAIRN_OK;
}

int cuda_add(cairn_backend *be, float *y, const float *a, const float *b, size_t n)
{
    return binary_launch(be, add_kernel, "add", y, a, b, n);
}

int cuda_add_bias(cairn_backend *be, float *x, const float *bias, int T, int n)
{
    if (!be || !x || !bias || T <= 0 || n <= 0)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    add_bias_kernel<<<grid_for((size_t)T * n), OPS_THREADS, 0, cuda_ctx_of(be)->stream>>>(x, bias,
                                                                                          T, n);
    CUDA_LAUNCHED("add_bias");
    return CAIRN_OK;
}

/* One block per source row i: y[rows[i]] += w[i] * src[i]. The rows are
 * distinct, so no two blocks write the same row. */
static __global__ void add_rows_scaled_kernel(float *y, const float *src, const int32_t *rows,
                                              const float *w, int D)
{
    const int i = blockIdx.x;
    float *dst = y + (size_t)rows[i] * D;
    const float *s = src + (size_t)i * D;
    const float wi = w[i];
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        dst[d] += wi * s[d];
}

int cuda_add_rows_scaled(cairn_backend *be, float *y, const float *src, const int32_t *rows,
                         const float *w, int n, int D)
{
    if (!be || cairn_add_rows_args_check(y, src, rows, w, n, D) != CAIRN_OK)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);
    const void *d_rows, *d_w;
    if ((rc = cuda_stage_copy(ctx, rows, (size_t)n * sizeof(int32_t), &d_rows)) != CAIRN_OK ||
        (rc = cuda_stage_copy(ctx, w, (size_t)n * sizeof(float), &d_w)) != CAIRN_OK)
        return rc;
    /* n <= max batch tokens, far below the grid's x limit */
    add_rows_scaled_kernel<<<n, OPS_THREADS, 0, ctx->stream>>>(y, src, (const int32_t *)d_rows,
                                                               (const float *)d_w, D);
    CUDA_LAUNCHED("add_rows_scaled");
    return CAIRN_OK;
}

/* ---- softmax ------------------------------------------------------------------- */

static __global__ void softmax_kernel(float *x, int n)
{
    __shared__ float red_f[32];
    __shared__ double red_d[32];
    float *xr = x + (size_t)blockIdx.x * n;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        m = xr[i] > m ? xr[i] : m; /* as the CPU: NaNs never become the max */
    m = block_max_float(m, red_f);
    if (m == -INFINITY) {
        /* all -inf (or NaN): no distribution, zeros instead of NaNs */
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            xr[i] = 0.0f;
        return;
    }
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(xr[i] - m);
        xr[i] = e;
        sum += (double)e;
    }
    sum = block_sum_double(sum, red_d);
    const float inv = (float)(1.0 / sum);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        xr[i] *= inv;
}

int cuda_softmax(cairn_backend *be, float *x, int T, int n)
{
    if (!be || !x || T <= 0 || n <= 0)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    softmax_kernel<<<T, OPS_THREADS, 0, cuda_ctx_of(be)->stream>>>(x, n);
    CUDA_LAUNCHED("softmax");
    return CAIRN_OK;
}

/* ---- kv_store -------------------------------------------------------------------- */

/* Block t: token t's K (blockIdx.y == 0) or V (1) row, converted to the
 * pool's dtype at its slot. */
static __global__ void kv_store_kernel(uint8_t *pool, int layer, int n_kv_head, int head_dim,
                                       int page_size, int f16, size_t row_bytes, size_t page_bytes,
                                       const float *k, const float *v, const int32_t *slots)
{
    const int t = blockIdx.x, kv = blockIdx.y;
    const int width = n_kv_head * head_dim;
    const int32_t slot = slots[t];
    const size_t page = (size_t)(slot / page_size);
    const int row = slot % page_size;
    uint8_t *dst = pool + page * page_bytes +
                   (((size_t)layer * 2 + (size_t)kv) * (size_t)page_size + (size_t)row) * row_bytes;
    const float *src = (kv ? v : k) + (size_t)t * width;
    if (f16) {
        __half *h = (__half *)dst;
        for (int i = threadIdx.x; i < width; i += blockDim.x)
            h[i] = __float2half_rn(src[i]);
    } else {
        float *f = (float *)dst;
        for (int i = threadIdx.x; i < width; i += blockDim.x)
            f[i] = src[i];
    }
}

/* The other KV types, and any rotation. Block (t, kvh, kv): one head of
 * token t's K (kv 0) or V (1) row.
 *   sx [head_dim]  the head in float, rotated in place by H_R when
 *                  rotation = R > 0 (block-wide butterflies), then
 *   F32/F16/BF16   each thread converts elements d = tid, tid + 128, ...;
 *   Q8_0/Q4_0      warp w quantizes blocks w, w + 4, ... of 32 elements, a
 *                  lane per element, in common/quant.c's expressions
 *                  (cairn_quantize_row): the scale and the codes are the
 *                  CPU's up to float rounding of the rotation.
 * Quantized blocks are 2-byte aligned (34, 18 bytes): written bytewise. */
template <int KT>
static __global__ void kv_store_head_kernel(uint8_t *pool, int layer, int head_dim, int rotation,
                                            int page_size, size_t head_bytes, size_t row_bytes,
                                            size_t page_bytes, const float *k, const float *v,
                                            const int32_t *slots)
{
    extern __shared__ float sx[];
    const int t = blockIdx.x, kvh = blockIdx.y, kv = blockIdx.z;
    const int width = gridDim.y * head_dim;
    const int32_t slot = slots[t];
    const size_t page = (size_t)(slot / page_size);
    const int row = slot % page_size;
    uint8_t *dst = pool + page * page_bytes +
                   (((size_t)layer * 2 + (size_t)kv) * (size_t)page_size + (size_t)row) * row_bytes +
                   (size_t)kvh * head_bytes;
    const float *src = (kv ? v : k) + (size_t)t * width + (size_t)kvh * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
        sx[d] = src[d];
    __syncthreads();
    if (rotation > 0)
        cu_fwht_runs<false>(sx, head_dim, rotation, threadIdx.x, blockDim.x);

    if (KT == CAIRN_TYPE_F32 || KT == CAIRN_TYPE_F16 || KT == CAIRN_TYPE_BF16) {
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            if (KT == CAIRN_TYPE_F32) {
                ((float *)dst)[d] = sx[d];
            } else if (KT == CAIRN_TYPE_F16) {
                ((__half *)dst)[d] = __float2half_rn(sx[d]);
            } else {
                /* cairn_fp32_to_bf16: nearest even, a NaN kept (quieted) */
                const unsigned x = __float_as_uint(sx[d]);
                const unsigned short b =
                    (x & 0x7fffffffu) > 0x7f800000u
                        ? (unsigned short)((x >> 16) | 0x40)
                        : (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
                ((unsigned short *)dst)[d] = b;
            }
        }
        return;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    for (int b = warp; b < head_dim / 32; b += n_warps) { /* uniform over the warp */
        const float x = sx[32 * b + lane];
        if (KT == CAIRN_TYPE_Q8_0) {
            uint8_t *blk = dst + 34 * (size_t)b;
            float amax = fabsf(x);
            for (int o = 16; o > 0; o >>= 1)
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float d = __fdiv_rn(amax, 127.0f);
            const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
            if (lane == 0) {
                const unsigned short h = __half_as_ushort(__float2half_rn(d));
                blk[0] = (uint8_t)(h & 0xff);
                blk[1] = (uint8_t)(h >> 8);
            }
            blk[2 + lane] = (uint8_t)(int8_t)roundf(__fmul_rn(x, id));
        } else { /* Q4_0 */
            uint8_t *blk = dst + 18 * (size_t)b;
            /* the value of largest magnitude, the first one on ties (the
             * CPU's strict > scan from element 0) */
            float ax = fabsf(x);
            int at = lane;
            for (int o = 16; o > 0; o >>= 1) {
                const float ax_o = __shfl_xor_sync(0xffffffffu, ax, o);
                const int at_o = __shfl_xor_sync(0xffffffffu, at, o);
                if (ax_o > ax || (ax_o == ax && at_o < at)) {
                    ax = ax_o;
                    at = at_o;
                }
            }
            float vmax = __shfl_sync(0xffffffffu, x, at);
            if (ax == 0.0f)
                vmax = 0.0f; /* the CPU starts from +0: an all-zero block gets d = -0 */
            const float d = __fdiv_rn(vmax, -8.0f);
            const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
            int q = (int)__fadd_rn(__fmul_rn(x, id), 8.5f);
            q = q < 0 ? 0 : q > 15 ? 15 : q;
            const int hi = __shfl_down_sync(0xffffffffu, q, 16);
            if (lane == 0) {
                const unsigned short h = __half_as_ushort(__float2half_rn(d));
                blk[0] = (uint8_t)(h & 0xff);
                blk[1] = (uint8_t)(h >> 8);
            }
            if (lane < 16)
                blk[2 + lane] = (uint8_t)(q | (hi << 4));
        }
    }
}

int cuda_kv_store(cairn_backend *be, void *kv_pool, const cairn_kv_layout *L, int layer,
                  const float *k, const float *v, const int32_t *slots, int T)
{
    if (!be || cairn_kv_store_args_check(kv_pool, L, layer, k, v, slots, T) != CAIRN_OK)
        return CAIRN_EINVAL;
    const size_t head_bytes = cairn_kv_head_bytes(L->dtype, L->head_dim);
    if (head_bytes == 0 || L->n_kv_head > 65535)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);
    const void *d_slots;
    if ((rc = cuda_stage_copy(ctx, slots, (size_t)T * sizeof(int32_t), &d_slots)) != CAIRN_OK)
        return rc;
    uint8_t *pool = (uint8_t *)kv_pool + L->layer_base;
    if ((L->dtype == CAIRN_TYPE_F32 || L->dtype == CAIRN_TYPE_F16) && !L->rotation) {
        dim3 grid((unsigned)T, 2);
        kv_store_kernel<<<grid, 128, 0, ctx->stream>>>(
            pool, layer, L->n_kv_head, L->head_dim, L->page_size, L->dtype == CAIRN_TYPE_F16,
            L->row_bytes, L->page_bytes, k, v, (const int32_t *)d_slots);
        CUDA_LAUNCHED("kv_store");
        return CAIRN_OK;
    }
    dim3 grid((unsigned)T, (unsigned)L->n_kv_head, 2);
    const size_t smem = (size_t)L->head_dim * sizeof(float);
#define KV_STORE_LAUNCH(KT)                                                                        \
    kv_store_head_kernel<KT><<<grid, 128, smem, ctx->stream>>>(                                    \
        pool, layer, L->head_dim, L->rotation, L->page_size, head_bytes, L->row_bytes,             \
        L->page_bytes, k, v, (const int32_t *)d_slots)
    CUDA_KV_TYPE_DISPATCH(L->dtype, KV_STORE_LAUNCH)
#undef KV_STORE_LAUNCH
    CUDA_LAUNCHED("kv_store");
    return CAIRN_OK;
}
