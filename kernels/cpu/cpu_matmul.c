/*
 * kernels/cpu/cpu_matmul.c — embedding lookup and matrix multiplication with
 * weights kept in GGUF block layout (F32, F16, BF16, Q8_0, Q4_0).
 *
 * This is the reference implementation: each weight row is expanded to floats
 * with cairn_dequantize_row (the definition of every format) and multiplied
 * with each token's activations by a single-precision dot product. The
 * expanded row is reused for all T tokens, so a batch costs one dequantization
 * per weight row, and a token's result does not depend on the batch size.
 * Work is split over output rows.
 */

#include "kernels/cpu/cpu_impl.h"

/* Items smaller than this many multiply-adds are grouped into one chunk, so
 * that waking a worker is worth it. */
#define CPU_MIN_CHUNK_WORK 32768

int cpu_type_supported(cairn_type type)
{
    switch (type) {
    case CAIRN_TYPE_F32:
    case CAIRN_TYPE_F16:
    case CAIRN_TYPE_BF16:
    case CAIRN_TYPE_Q8_0:
    case CAIRN_TYPE_Q4_0:
        return 1;
    default:
        return 0;
    }
}

float cpu_dot_f32(const float *a, const float *b, int64_t n)
{
    /* Eight independent partial sums: a fixed summation order (so the result
     * is reproducible) that the compiler can keep in one vector register. */
    float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            partial[l] += a[i + l] * b[i + l];
    float sum = ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                ((partial[4] + partial[5]) + (partial[6] + partial[7]));
    for (; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

/* Number of elements of `type` in a row must be a whole number of blocks. */
static int row_shape_ok(cairn_type type, int64_t n)
{
    const cairn_type_traits *tt = cairn_type_get(type);
    return tt && n > 0 && n % tt->block_elems == 0;
}

/* ---- get_rows ---------------------------------------------------------- */

typedef struct {
    float *out;          /* [T][D] */
    const uint8_t *table;
    cairn_type type;
    int D;
    size_t row_bytes;
    const int32_t *ids;  /* [T] */
} get_rows_job;

static void get_rows_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const get_rows_job *job = p;
    for (int64_t t = begin; t < end; t++) {
        const uint8_t *row = job->table + (size_t)job->ids[t] * job->row_bytes;
        /* Cannot fail: the type and D were validated before the job ran. */
        (void)cairn_dequantize_row(job->type, row, job->out + (size_t)t * (size_t)job->D, job->D);
    }
}

int cpu_get_rows(cairn_backend *be, float *out, const void *table, cairn_type type, int D,
                 const int32_t *ids, int T)
{
    if (!be || !out || !table || !ids || D <= 0 || T <= 0)
        return CAIRN_EINVAL;
    if (!cpu_type_supported(type) || !row_shape_ok(type, D))
        return CAIRN_EINVAL;
    for (int t = 0; t < T; t++)
        if (ids[t] < 0)
            return CAIRN_EINVAL;
    get_rows_job job = {
        .out = out, .table = table, .type = type, .D = D,
        .row_bytes = cairn_type_row_bytes(type, D), .ids = ids,
    };
    cpu_ctx *ctx = cpu_ctx_of(be);
    cpu_pool_parallel_for(ctx->pool, T, 1 + CPU_MIN_CHUNK_WORK / D, get_rows_range, &job);
    return CAIRN_OK;
}

/* ---- matmul ------------------------------------------------------------ */

typedef struct {
    cpu_ctx *ctx;
    float *y;            /* [T][n_out] */
    const uint8_t *W;    /* [n_out] rows of row_bytes */
    cairn_type wtype;
    const float *x;      /* [T][n_in] */
    int T, n_in, n_out;
    size_t row_bytes;
} matmul_job;

static void matmul_range(void *p, int64_t begin, int64_t end, int thread)
{
    const matmul_job *job = p;
    float *expanded = cpu_scratch_of(job->ctx, thread); /* [n_in] */
    for (int64_t r = begin; r < end; r++) {
        const void *src = job->W + (size_t)r * job->row_bytes;
        const float *w;
        if (job->wtype == CAIRN_TYPE_F32) {
            w = src;
        } else {
            (void)cairn_dequantize_row(job->wtype, src, expanded, job->n_in);
            w = expanded;
        }
        for (int t = 0; t < job->T; t++)
            job->y[(size_t)t * (size_t)job->n_out + (size_t)r] =
                cpu_dot_f32(w, job->x + (size_t)t * (size_t)job->n_in, job->n_in);
    }
}

int cpu_matmul(cairn_backend *be, float *y, const void *W, cairn_type wtype, const float *x,
               int T, int n_in, int n_out)
{
    if (!be || !y || !W || !x || T <= 0 || n_in <= 0 || n_out <= 0)
        return CAIRN_EINVAL;
    if (!cpu_type_supported(wtype) || !row_shape_ok(wtype, n_in))
        return CAIRN_EINVAL;
    /* y is written while x is still being read. */
    if ((const float *)y == x)
        return CAIRN_EINVAL;
    cpu_ctx *ctx = cpu_ctx_of(be);
    if (wtype != CAIRN_TYPE_F32) {
        int rc = cpu_scratch_reserve(ctx, (size_t)n_in);
        if (rc != CAIRN_OK)
            return rc;
    }
    matmul_job job = {
        .ctx = ctx, .y = y, .W = W, .wtype = wtype, .x = x,
        .T = T, .n_in = n_in, .n_out = n_out,
        .row_bytes = cairn_type_row_bytes(wtype, n_in),
    };
    int64_t work_per_row = (int64_t)n_in * T;
    cpu_pool_parallel_for(ctx->pool, n_out, 1 + CPU_MIN_CHUNK_WORK / work_per_row, matmul_range,
                          &job);
    return CAIRN_OK;
}
