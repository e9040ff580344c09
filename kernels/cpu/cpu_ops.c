/*
 * kernels/cpu/cpu_ops.c — the small per-row and element-wise ops: RMSNorm,
 * RoPE, SwiGLU, add and softmax.
 *
 * Where llama.cpp's CPU ops make a particular choice of float expression
 * (double accumulation in RMSNorm and softmax, the way RoPE's angles are
 * built), the same choice is made here so cairn's logits track llama.cpp's
 * closely; each such place says so.
 */
#include <math.h>

#include "kernels/cpu/cpu_impl.h"

/* Element-wise work below this many elements runs on the calling thread;
 * above it, chunks are at least this big. */
#define CPU_ELEMWISE_CHUNK 16384

/* ---- rmsnorm ----------------------------------------------------------- */

typedef struct {
    float *out;
    const float *x, *w; /* x, out: [T][D]; w: [D] */
    int D;
    float eps;
} rmsnorm_job;

static void rmsnorm_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const rmsnorm_job *job = p;
    const int D = job->D;
    for (int64_t t = begin; t < end; t++) {
        const float *x = job->x + (size_t)t * (size_t)D;
        float *out = job->out + (size_t)t * (size_t)D;
        /* Sum of squares in double, as llama.cpp does: a row of thousands of
         * squares loses several bits in a float sum. */
        double sum = 0.0;
        for (int i = 0; i < D; i++)
            sum += (double)(x[i] * x[i]);
        const float mean = (float)(sum / D);
        const float scale = 1.0f / sqrtf(mean + job->eps);
        /* Normalise first, then apply the weight (llama.cpp's rms_norm then
         * mul), so out may alias x. */
        for (int i = 0; i < D; i++)
            out[i] = (x[i] * scale) * job->w[i];
    }
}

int cpu_rmsnorm(cairn_backend *be, float *out, const float *x, const float *w, int T, int D,
                float eps)
{
    if (!be || !out || !x || !w || T <= 0 || D <= 0 || !(eps >= 0.0f))
        return CAIRN_EINVAL;
    rmsnorm_job job = {.out = out, .x = x, .w = w, .D = D, .eps = eps};
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, T, 1 + CPU_ELEMWISE_CHUNK / D, rmsnorm_range, &job);
    return CAIRN_OK;
}

/* ---- rope -------------------------------------------------------------- */

typedef struct {
    cpu_ctx *ctx;
    float *x;            /* [T][n_heads][head_dim] */
    int n_heads, head_dim;
    const int32_t *pos;  /* [T] */
    int n_rot;
    cairn_rope_mode mode;
    float theta_scale;   /* freq_base^(-2/n_rot) */
    float freq_scale;
    const float *freq_factors; /* [n_rot/2] or NULL */
} rope_job;

/* cos and sin of every pair's angle at position `pos`, into cs[2*i], cs[2*i+1].
 *
 * The angle of pair i is pos * freq_scale * base^(-2i/n_rot) / factor_i.
 * It is built as llama.cpp builds it, so both round alike: the base power
 * is a running product of theta_scale = powf(base, -2/n_rot) (not a powf
 * per pair), the factor divides the unscaled angle, and freq_scale multiplies
 * last. At large positions the float rounding of these steps moves the angle
 * by far more than an ulp of the output, so a different but "more exact"
 * expression would drift away from llama.cpp's results. */
static void rope_angles(const rope_job *job, int32_t pos, float *cs)
{
    float theta = (float)pos;
    for (int i = 0; i < job->n_rot / 2; i++) {
        const float factor = job->freq_factors ? job->freq_factors[i] : 1.0f;
        const float angle = job->freq_scale * (theta / factor);
        cs[2 * i] = cosf(angle);
        cs[2 * i + 1] = sinf(angle);
        theta *= job->theta_scale;
    }
}

static void rope_range(void *p, int64_t begin, int64_t end, int thread)
{
    const rope_job *job = p;
    float *cs = cpu_scratch_of(job->ctx, thread); /* [n_rot] */
    const int half = job->n_rot / 2;
    /* NORMAL pairs adjacent elements (2i, 2i+1); NEOX pairs the two halves
     * of the rotated part (i, i + n_rot/2). Elements at and beyond n_rot are
     * left as they are. */
    const int stride = job->mode == CAIRN_ROPE_NEOX ? 1 : 2;
    const int offset = job->mode == CAIRN_ROPE_NEOX ? half : 1;
    for (int64_t t = begin; t < end; t++) {
        rope_angles(job, job->pos[t], cs);
        for (int h = 0; h < job->n_heads; h++) {
            float *v = job->x + ((size_t)t * (size_t)job->n_heads + (size_t)h) * (size_t)job->head_dim;
            for (int i = 0; i < half; i++) {
                float *a = v + (size_t)i * (size_t)stride;
                float *b = a + offset;
                const float c = cs[2 * i], s = cs[2 * i + 1];
                const float x0 = *a, x1 = *b;
                *a = x0 * c - x1 * s;
                *b = x0 * s + x1 * c;
            }
        }
    }
}

int cpu_rope(cairn_backend *be, float *x, int T, int n_heads, int head_dim, const int32_t *pos,
             const cairn_rope_params *p)
{
    if (!be || cairn_rope_args_check(x, T, n_heads, head_dim, pos, p) != CAIRN_OK)
        return CAIRN_EINVAL;
    cpu_ctx *ctx = cpu_ctx_of(be);
    int rc = cpu_scratch_reserve(ctx, (size_t)p->n_rot);
    if (rc != CAIRN_OK)
        return rc;
    rope_job job = {
        .ctx = ctx, .x = x, .n_heads = n_heads, .head_dim = head_dim, .pos = pos,
        .n_rot = p->n_rot, .mode = p->mode,
        .theta_scale = powf(p->freq_base, -2.0f / (float)p->n_rot),
        .freq_scale = p->freq_scale, .freq_factors = p->freq_factors,
    };
    int64_t work_per_token = (int64_t)n_heads * p->n_rot;
    cpu_pool_parallel_for(ctx->pool, T, 1 + CPU_ELEMWISE_CHUNK / work_per_token, rope_range, &job);
    return CAIRN_OK;
}

/* ---- swiglu and add ---------------------------------------------------- */

typedef struct {
    float *out;
    const float *a, *b;
    cpu_isa isa;
    float alpha, limit; /* swiglu_clamped */
} binary_job;

static void swiglu_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const binary_job *job = p;
    /* AVX-512: the same expression with a vector exponential (llama.cpp's
     * CPU backend also uses one there). */
    if (cpu_x86_swiglu(job->isa, job->out + begin, job->a + begin, job->b + begin, end - begin))
        return;
    for (int64_t i = begin; i < end; i++) {
        const float g = job->a[i];
        /* silu(g) = g * sigmoid(g), written as llama.cpp writes it. */
        job->out[i] = g / (1.0f + expf(-g)) * job->b[i];
    }
}

static void geglu_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const binary_job *job = p;
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = begin; i < end; i++) {
        const float g = job->a[i];
        job->out[i] = 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * job->b[i];
    }
}

static void swiglu_clamped_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const binary_job *job = p;
    const float alpha = job->alpha, limit = job->limit;
    for (int64_t i = begin; i < end; i++) {
        const float g = job->a[i] < limit ? job->a[i] : limit;
        float u = job->b[i];
        u = u < -limit ? -limit : u > limit ? limit : u;
        job->out[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
    }
}

static void add_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const binary_job *job = p;
    for (int64_t i = begin; i < end; i++)
        job->out[i] = job->a[i] + job->b[i];
}

static int run_binary(cairn_backend *be, float *out, const float *a, const float *b, size_t n,
                      cpu_range_fn fn)
{
    if (!be || !out || !a || !b || n == 0 || n > (size_t)INT64_MAX)
        return CAIRN_EINVAL;
    binary_job job = {.out = out, .a = a, .b = b, .isa = cpu_ctx_of(be)->isa};
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, (int64_t)n, CPU_ELEMWISE_CHUNK, fn, &job);
    return CAIRN_OK;
}

int cpu_swiglu(cairn_backend *be, float *out, const float *gate, const float *up, size_t n)
{
    return run_binary(be, out, gate, up, n, swiglu_range);
}

int cpu_geglu(cairn_backend *be, float *out, const float *gate, const float *up, size_t n)
{
    return run_binary(be, out, gate, up, n, geglu_range);
}

int cpu_swiglu_clamped(cairn_backend *be, float *out, const float *gate, const float *up,
                       size_t n, float alpha, float limit)
{
    if (!be || !out || !gate || !up || n == 0 || n > (size_t)INT64_MAX || !isfinite(alpha) ||
        !(limit > 0))
        return CAIRN_EINVAL;
    binary_job job = {.out = out, .a = gate, .b = up, .isa = cpu_ctx_of(be)->isa,
                      .alpha = alpha, .limit = limit};
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, (int64_t)n, CPU_ELEMWISE_CHUNK,
                          swiglu_clamped_range, &job);
    return CAIRN_OK;
}

int cpu_add(cairn_backend *be, float *y, const float *a, const float *b, size_t n)
{
    return run_binary(be, y, a, b, n, add_range);
}

typedef struct {
    float *x;
    float s;
} scale_job;

static void scale_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const scale_job *job = p;
    for (int64_t i = begin; i < end; i++)
        job->x[i] *= job->s;
}

int cpu_scale(cairn_backend *be, float *x, float s, size_t n)
{
    if (!be || !x || n == 0 || n > (size_t)INT64_MAX || !isfinite(s))
        return CAIRN_EINVAL;
    scale_job job = {.x = x, .s = s};
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, (int64_t)n, CPU_ELEMWISE_CHUNK, scale_range, &job);
    return CAIRN_OK;
}

typedef struct {
    float *out;
    const float *x;
    const int32_t *idx;
    int n;
} gather_job;

static void gather_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const gather_job *job = p;
    for (int64_t t = begin; t < end; t++) {
        const float *x = job->x + t * job->n;
        float *out = job->out + t * job->n;
        for (int j = 0; j < job->n; j++)
            out[j] = x[job->idx[j]];
    }
}

int cpu_gather_cols(cairn_backend *be, float *out, const float *x, const int32_t *idx, int T,
                    int n)
{
    if (!be || !out || !x || !idx || T <= 0 || n <= 0)
        return CAIRN_EINVAL;
    for (int j = 0; j < n; j++)
        if (idx[j] < 0 || idx[j] >= n)
            return CAIRN_EINVAL;
    gather_job job = {.out = out, .x = x, .idx = idx, .n = n};
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, T, 1, gather_range, &job);
    return CAIRN_OK;
}

typedef struct {
    float *x;          /* [T][n] */
    const float *bias; /* [n]    */
    int n;
} bias_job;

static void add_bias_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const bias_job *job = p;
    for (int64_t t = begin; t < end; t++) {
        float *row = job->x + (size_t)t * (size_t)job->n;
        for (int i = 0; i < job->n; i++)
            row[i] += job->bias[i];
    }
}

int cpu_add_bias(cairn_backend *be, float *x, const float *bias, int T, int n)
{
    if (!be || !x || !bias || T <= 0 || n <= 0)
        return CAIRN_EINVAL;
    bias_job job = {.x = x, .bias = bias, .n = n};
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, T, 1 + CPU_ELEMWISE_CHUNK / n, add_bias_range,
                          &job);
    return CAIRN_OK;
}

typedef struct {
    float *y;
    const float *src;
    const int32_t *rows;
    const float *w;
    int D;
} rows_scaled_job;

static void add_rows_scaled_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const rows_scaled_job *job = p;
    for (int64_t i = begin; i < end; i++) {
        float *dst = job->y + (size_t)job->rows[i] * (size_t)job->D;
        const float *s = job->src + (size_t)i * (size_t)job->D;
        const float w = job->w[i];
        for (int d = 0; d < job->D; d++)
            dst[d] += w * s[d];
    }
}

int cpu_add_rows_scaled(cairn_backend *be, float *y, const float *src, const int32_t *rows,
                        const float *w, int n, int D)
{
    if (!be || cairn_add_rows_args_check(y, src, rows, w, n, D) != CAIRN_OK)
        return CAIRN_EINVAL;
    /* the rows are distinct: workers never write the same row */
    rows_scaled_job job = {.y = y, .src = src, .rows = rows, .w = w, .D = D};
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, n, 1 + CPU_ELEMWISE_CHUNK / D,
                          add_rows_scaled_range, &job);
    return CAIRN_OK;
}

/* ---- softmax ----------------------------------------------------------- */

typedef struct {
    float *x; /* [T][n] */
    int n;
} softmax_job;

static void softmax_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const softmax_job *job = p;
    const int n = job->n;
    for (int64_t t = begin; t < end; t++) {
        float *x = job->x + (size_t)t * (size_t)n;
        float max = -INFINITY;
        for (int i = 0; i < n; i++)
            max = x[i] > max ? x[i] : max;
        if (max == -INFINITY) {
            /* Every entry is -inf (or NaN): there is no distribution; give
             * all-zero probabilities rather than NaNs. */
            for (int i = 0; i < n; i++)
                x[i] = 0.0f;
            continue;
        }
        /* Subtracting the maximum keeps every exponent <= 0, so nothing
         * overflows; the sum is kept in double as llama.cpp does. */
        double sum = 0.0;
        for (int i = 0; i < n; i++) {
            const float e = expf(x[i] - max);
            x[i] = e;
            sum += (double)e;
        }
        const float inv = (float)(1.0 / sum);
        for (int i = 0; i < n; i++)
            x[i] *= inv;
    }
}

int cpu_softmax(cairn_backend *be, float *x, int T, int n)
{
    if (!be || !x || T <= 0 || n <= 0)
        return CAIRN_EINVAL;
    softmax_job job = {.x = x, .n = n};
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, T, 1 + CPU_ELEMWISE_CHUNK / n, softmax_range, &job);
    return CAIRN_OK;
}
