/*
 * kernels/cpu/cpu_matmul.c — embedding lookup and matrix multiplication with
 * weights kept in GGUF block layout (F32, F16, BF16, Q8_0, Q4_0, Q5_0, MXFP4,
 * Q4_K, Q5_K, Q6_K) or cairn's checkpoint layouts (Q4_Z, F8_E4M3).
 *
 * Three paths, chosen per call:
 *   - quantized weights (unless the backend was created exact): the
 *     activations are quantized to int8 per 32-element block and multiplied
 *     in integers, 16 rows (one packed group, cpu_impl.h "Packed weights")
 *     per work item: the group comes straight from a weight that
 *     upload_weight packed, or is packed from GGUF rows into thread scratch
 *     first; cpu_x86_quant.c computes it, or q8act_dot_ref below on the
 *     scalar level, all three to the same bits.
 *   - F32/F16/BF16/F8_E4M3 weights on AVX2/AVX-512: vector dot-product
 *     tiles (cpu_x86_float.c), exact float semantics.
 *   - Otherwise the reference: each weight row is expanded to floats with
 *     cairn_dequantize_row (the definition of every format) and multiplied
 *     with each token's activations by a single-precision dot product.
 * All of them split work over output rows, and none makes a token's result
 * depend on the thread count; the float paths also not on the batch size.
 */

#include <stdlib.h>

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

int cpu_q8act_type(cairn_type type)
{
    /* F8_E4M3 is a float format (a float scale times an exact e4m3 value):
     * it takes the float path, like F16 */
    return cpu_type_supported(type) && type != CAIRN_TYPE_F32 && type != CAIRN_TYPE_F16 &&
           type != CAIRN_TYPE_BF16 && type != CAIRN_TYPE_F8_E4M3;
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

/* The f16 at p as a float. */
static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return cpu_half_to_float(h);
}

/* Number of elements of `type` in a row must be a whole number of blocks. */
static int row_shape_ok(cairn_type type, int64_t n)
{
    const cairn_type_traits *tt = cairn_type_get(type);
    return tt && n > 0 && n % tt->block_elems == 0;
}

/* ---- get_rows ---------------------------------------------------------- */

typedef struct {
    cpu_ctx *ctx;
    float *out;          /* [T][D] */
    const uint8_t *table;
    cairn_type type;     /* the GGUF type */
    int D;
    size_t row_bytes;
    const int32_t *ids;  /* [T] */
    int packed;          /* table in the packed layout (geom) */
    cpu_pack_geom geom;
} get_rows_job;

static void get_rows_range(void *p, int64_t begin, int64_t end, int thread)
{
    const get_rows_job *job = p;
    for (int64_t t = begin; t < end; t++) {
        const int64_t id = job->ids[t];
        float *out = job->out + (size_t)t * (size_t)job->D;
        const uint8_t *row = job->table + (size_t)id * job->row_bytes;
        if (job->packed) { /* the row back in GGUF layout, in thread scratch */
            uint8_t *gguf = (uint8_t *)cpu_scratch_of(job->ctx, thread);
            cpu_unpack_row(&job->geom,
                           job->table + (size_t)(id / CPU_PACK_ROWS) * job->geom.group_bytes,
                           (int)(id % CPU_PACK_ROWS), gguf);
            row = gguf;
        }
        /* Cannot fail: the type and D were validated before the job ran. */
        (void)cairn_dequantize_row(job->type, row, out, job->D);
    }
}

int cpu_get_rows(cairn_backend *be, float *out, const void *table, cairn_type type, int D,
                 const int32_t *ids, int T)
{
    if (!be || !out || !table || !ids || D <= 0 || T <= 0)
        return CAIRN_EINVAL;
    const int packed = cpu_is_packed(type);
    type = cpu_unpacked_type(type);
    if (!cpu_type_supported(type) || !row_shape_ok(type, D))
        return CAIRN_EINVAL;
    for (int t = 0; t < T; t++)
        if (ids[t] < 0)
            return CAIRN_EINVAL;
    cpu_ctx *ctx = cpu_ctx_of(be);
    get_rows_job job = {
        .ctx = ctx, .out = out, .table = table, .type = type, .D = D,
        .row_bytes = cairn_type_row_bytes(type, D), .ids = ids, .packed = packed,
    };
    if (packed) {
        if (!cpu_pack_geom_init(&job.geom, type, D))
            return CAIRN_EINVAL;
        int rc = cpu_scratch_reserve(ctx, job.geom.row_bytes / sizeof(float) + 1);
        if (rc != CAIRN_OK)
            return rc;
    }
    cpu_pool_parallel_for(ctx->pool, T, 1 + CPU_MIN_CHUNK_WORK / D, get_rows_range, &job);
    return CAIRN_OK;
}

/* ---- matmul ------------------------------------------------------------ */

typedef struct {
    cpu_ctx *ctx;
    float *y;            /* [T][n_out] */
    const uint8_t *W;    /* [n_out] rows of row_bytes, or packed groups (geom) */
    cairn_type wtype;    /* the GGUF type */
    int packed;          /* W is in the packed layout */
    cpu_pack_geom geom;  /* when W is packed, or packed on the fly */
    const float *x;      /* [T][n_in] */
    int T, n_in, n_out;
    size_t row_bytes;
    int rows_per_item;   /* output rows per parallel-for item */
    cpu_act act;         /* quantized path: the activations and this type's corrections */
} matmul_job;

/* Row r of the job's weights in GGUF layout: in place, or unpacked into
 * `buf` (row_bytes) from its packed group. */
static const uint8_t *gguf_row(const matmul_job *job, int64_t r, uint8_t *buf)
{
    if (!job->packed)
        return job->W + (size_t)r * job->row_bytes;
    cpu_unpack_row(&job->geom, job->W + (size_t)(r / CPU_PACK_ROWS) * job->geom.group_bytes,
                   (int)(r % CPU_PACK_ROWS), buf);
    return buf;
}

/* A row of F8_E4M3 weights as floats: w = d * e4m3(q), the expression of
 * cairn_dequantize_row with the exact inline decoder instead of ldexpf
 * (the scalar level's F8 matmul runs through here). */
static void expand_f8_row(const uint8_t *src, float *w, int n)
{
    for (int b = 0; b < n / 32; b++, src += 36) {
        float d;
        memcpy(&d, src, 4);
        for (int j = 0; j < 32; j++)
            w[32 * b + j] = d * cpu_e4m3_to_float(src[4 + j]);
    }
}

/* The reference: expand the weight row to floats, one float dot per token.
 * Scratch: [n_in] floats, then a GGUF row for packed weights. */
static void matmul_range(void *p, int64_t begin, int64_t end, int thread)
{
    const matmul_job *job = p;
    float *expanded = cpu_scratch_of(job->ctx, thread); /* [n_in] */
    uint8_t *row_buf = (uint8_t *)(expanded + job->n_in);
    for (int64_t r = begin; r < end; r++) {
        const void *src = gguf_row(job, r, row_buf);
        const float *w;
        if (job->wtype == CAIRN_TYPE_F32) {
            w = src;
        } else if (job->wtype == CAIRN_TYPE_F8_E4M3) {
            expand_f8_row(src, expanded, job->n_in);
            w = expanded;
        } else {
            (void)cairn_dequantize_row(job->wtype, src, expanded, job->n_in);
            w = expanded;
        }
        for (int t = 0; t < job->T; t++)
            job->y[(size_t)t * (size_t)job->n_out + (size_t)r] =
                cpu_dot_f32(w, job->x + (size_t)t * (size_t)job->n_in, job->n_in);
    }
}

/* Item range -> row range of the vector kernels. */
static void item_rows(const matmul_job *job, int64_t begin, int64_t end, int64_t *r0, int64_t *r1)
{
    *r0 = begin * job->rows_per_item;
    *r1 = end * job->rows_per_item;
    if (*r1 > job->n_out)
        *r1 = job->n_out;
}

static void matmul_float_range(void *p, int64_t begin, int64_t end, int thread)
{
    const matmul_job *job = p;
    int64_t r0, r1;
    item_rows(job, begin, end, &r0, &r1);
    (void)cpu_x86_matmul_float(job->ctx->isa, job->y, job->W, job->wtype, job->row_bytes, job->x,
                               job->T, job->n_in, job->n_out, r0, r1,
                               cpu_scratch_of(job->ctx, thread));
}

/* The 32 unsigned codes c of block b (32-element block or sub-block) of a
 * row of `wtype` (layouts in common/common.h). */
static void block_codes(const uint8_t *row, cairn_type wtype, int b, int codes[32])
{
    if (wtype == CAIRN_TYPE_MXFP4) { /* { e, qs[16] }: Q4_0's nibble order */
        const uint8_t *nib = row + (size_t)b * 17 + 1;
        for (int j = 0; j < 16; j++) {
            codes[j] = cpu_mxfp4_code(nib[j] & 0x0f);
            codes[j + 16] = cpu_mxfp4_code(nib[j] >> 4);
        }
        return;
    }
    if (wtype == CAIRN_TYPE_Q4_Z) {
        const uint8_t *nib = row + (size_t)b * 20 + 4;
        for (int j = 0; j < 16; j++) {
            codes[j] = nib[j] & 0x0f;
            codes[j + 16] = nib[j] >> 4;
        }
        return;
    }
    if (wtype == CAIRN_TYPE_Q8_0 || wtype == CAIRN_TYPE_Q4_0 || wtype == CAIRN_TYPE_Q5_0) {
        const size_t bs = wtype == CAIRN_TYPE_Q8_0 ? 34 : wtype == CAIRN_TYPE_Q4_0 ? 18 : 22;
        const uint8_t *blk = row + (size_t)b * bs;
        if (wtype == CAIRN_TYPE_Q8_0) {
            for (int j = 0; j < 32; j++)
                codes[j] = (int8_t)blk[2 + j]; /* signed, zero point 0 */
            return;
        }
        const uint8_t *nib = blk + (wtype == CAIRN_TYPE_Q4_0 ? 2 : 6);
        const uint32_t qh = wtype == CAIRN_TYPE_Q5_0
                                ? (uint32_t)blk[2] | ((uint32_t)blk[3] << 8) |
                                      ((uint32_t)blk[4] << 16) | ((uint32_t)blk[5] << 24)
                                : 0;
        for (int j = 0; j < 16; j++) {
            codes[j] = (nib[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            codes[j + 16] = (nib[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        }
        return;
    }
    const int sub = b % 8; /* 32-element block within the 256-element super-block */
    if (wtype == CAIRN_TYPE_Q6_K) {
        const uint8_t *blk = row + (size_t)(b / 8) * 210;
        const int h = sub / 4, k = sub % 4;
        for (int l = 0; l < 32; l++) {
            const uint8_t lowbyte = blk[64 * h + l + 32 * (k & 1)];
            codes[l] = (k < 2 ? lowbyte & 0x0f : lowbyte >> 4) |
                       (((blk[128 + 32 * h + l] >> (2 * k)) & 3) << 4);
        }
        return;
    }
    const size_t bs = wtype == CAIRN_TYPE_Q4_K ? 144 : 176;
    const uint8_t *blk = row + (size_t)(b / 8) * bs;
    const uint8_t *nib = blk + (wtype == CAIRN_TYPE_Q4_K ? 16 : 48) + 32 * (sub / 2);
    for (int l = 0; l < 32; l++) {
        codes[l] = (sub & 1) ? nib[l] >> 4 : nib[l] & 0x0f;
        if (wtype == CAIRN_TYPE_Q5_K)
            codes[l] |= ((blk[16 + l] >> sub) & 1) << 4;
    }
}

/* Scalar kernel of the quantized-activation semantics: the expression of
 * cpu_q8act_type (cpu_impl.h) with fmaf for each fma, so the vector
 * kernels' results are this function's bit for bit.
 *
 * Kept out of GCC's auto-vectorizer: GCC 12.2 with AVX-512 VNNI turns this
 * mixed-sign byte dot product into a wrong vpdpbusd sequence (it returned
 * garbage in the kernel tests); the reference must be plain arithmetic. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
static float q8act_dot_ref(const uint8_t *row, cairn_type wtype, const cpu_act *act, int t,
                           int n_in)
{
    float acc = 0.0f;
    for (int b = 0; b < n_in / 32; b++) {
        int codes[32];
        block_codes(row, wtype, b, codes);
        const size_t e = cpu_act_index(act->nb, t, b);
        const int8_t *qb = act->q + 32 * e;
        const float da = act->d[e];
        const int32_t sa = act->s[e];
        if (wtype == CAIRN_TYPE_MXFP4) {
            /* twice the E2M1 values as codes 0..24 around 12, the E8M0
             * scale halved (cpu_mxfp4_scale) */
            int32_t isum = 0;
            for (int j = 0; j < 32; j++)
                isum += (codes[j] - CPU_MXFP4_ZERO) * qb[j];
            acc = fmaf((float)isum, cpu_mxfp4_scale(row[(size_t)b * 17]) * da, acc);
        } else if (wtype == CAIRN_TYPE_Q8_0 || wtype == CAIRN_TYPE_Q4_0 ||
                   wtype == CAIRN_TYPE_Q5_0 || wtype == CAIRN_TYPE_Q4_Z) {
            const size_t bs = wtype == CAIRN_TYPE_Q8_0   ? 34
                            : wtype == CAIRN_TYPE_Q4_0   ? 18
                            : wtype == CAIRN_TYPE_Q5_0   ? 22
                                                         : 20;
            const uint8_t *blk = row + (size_t)b * bs;
            /* Q4_Z: the zero is the block's own byte (any u8: GPTQ's v1
             * format stores 16 for a symmetric group); the sum stays exact
             * in int32 (|c - z| <= 255, |q_a| <= 127, 32 terms) */
            const int zero = wtype == CAIRN_TYPE_Q8_0   ? 0
                           : wtype == CAIRN_TYPE_Q4_0   ? 8
                           : wtype == CAIRN_TYPE_Q5_0   ? 16
                                                        : blk[2];
            int32_t isum = 0;
            for (int j = 0; j < 32; j++)
                isum += (codes[j] - zero) * qb[j];
            acc = fmaf((float)isum, half_to_float(blk) * da, acc);
        } else if (wtype == CAIRN_TYPE_Q6_K) {
            const uint8_t *blk = row + (size_t)(b / 8) * 210;
            const int8_t *sc = (const int8_t *)(blk + 192) + 2 * (b % 8);
            int32_t lo = 0, hi = 0;
            for (int j = 0; j < 16; j++) {
                lo += (codes[j] - 32) * qb[j];
                hi += (codes[j + 16] - 32) * qb[j + 16];
            }
            const float dd = half_to_float(blk + 208);
            acc = fmaf((float)lo, (dd * (float)sc[0]) * da, acc);
            acc = fmaf((float)hi, (dd * (float)sc[1]) * da, acc);
        } else { /* Q4_K, Q5_K */
            const uint8_t *blk = row + (size_t)(b / 8) * (wtype == CAIRN_TYPE_Q4_K ? 144 : 176);
            uint8_t sc[8], mn[8];
            cpu_kq_scales(blk + 4, sc, mn);
            int32_t isum = 0;
            for (int j = 0; j < 32; j++)
                isum += codes[j] * qb[j];
            const float dd = half_to_float(blk), dmin = half_to_float(blk + 2);
            acc = fmaf((float)isum, (dd * (float)sc[b % 8]) * da, acc);
            acc = fmaf(dmin * (float)mn[b % 8], -da * (float)sa, acc);
        }
    }
    return acc;
}

/* Items of 16 rows: one packed group each, computed two at a time where
 * the item range allows (the kernels give the same bits either way).
 * Scratch per thread: two groups (packed here from GGUF rows when the
 * weight is not packed) and a GGUF row (the scalar level's view of a
 * packed one). */
static void matmul_q8act_range(void *p, int64_t begin, int64_t end, int thread)
{
    const matmul_job *job = p;
    cpu_ctx *ctx = job->ctx;
    uint8_t *scratch = (uint8_t *)cpu_scratch_of(ctx, thread);
    for (int64_t grp = begin; grp < end;) {
        const int64_t r = grp * CPU_PACK_ROWS;
        const int64_t n_grp = end - grp >= 2 ? 2 : 1;
        const int64_t rows64 = job->n_out - r < n_grp * CPU_PACK_ROWS ? job->n_out - r
                                                                      : n_grp * CPU_PACK_ROWS;
        const int rows = (int)rows64;
        if (ctx->isa >= CPU_ISA_AVX2) {
            const uint8_t *group = job->W + (size_t)grp * job->geom.group_bytes;
            if (!job->packed) {
                for (int i = 0; i < rows; i += CPU_PACK_ROWS)
                    cpu_pack_group(&job->geom, job->W + (size_t)(r + i) * job->row_bytes,
                                   job->row_bytes, rows - i < 16 ? rows - i : 16,
                                   scratch + (size_t)(i / 16) * job->geom.group_bytes);
                group = scratch;
            }
            if (cpu_x86_gemm_groups(ctx->isa, &job->geom, group, rows, &job->act, job->T,
                                    job->n_in, job->y + r, job->n_out, &ctx->tune)) {
                grp += n_grp;
                continue;
            }
        }
        for (int i = 0; i < rows; i++) {
            const uint8_t *row = gguf_row(job, r + i, scratch);
            for (int t = 0; t < job->T; t++)
                job->y[(size_t)t * job->n_out + (size_t)(r + i)] =
                    q8act_dot_ref(row, job->wtype, &job->act, t, job->n_in);
        }
        grp += n_grp;
    }
}

/* Packed F16/BF16 weights (AVX-512): items of 16 rows, two at a time like
 * the quantized ones; job->act.q holds the bf16 activations in bf16 mode. */
static void matmul_float_packed_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const matmul_job *job = p;
    cpu_ctx *ctx = job->ctx;
    const uint16_t *xb = job->wtype == CAIRN_TYPE_BF16 && ctx->bf16_dot ? ctx->act_bf16 : NULL;
    for (int64_t grp = begin; grp < end; grp += 2) {
        const int64_t r = grp * CPU_PACK_ROWS;
        const int64_t n_grp = end - grp >= 2 ? 2 : 1;
        const int64_t rows = job->n_out - r < n_grp * CPU_PACK_ROWS ? job->n_out - r
                                                                    : n_grp * CPU_PACK_ROWS;
        (void)cpu_x86_gemm_float_groups(ctx->isa, job->wtype, job->geom.group_bytes,
                                        job->W + (size_t)grp * job->geom.group_bytes, (int)rows,
                                        job->x, xb, job->T, job->n_in, job->y + r, job->n_out,
                                        &ctx->tune);
    }
}

static void bf16_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const matmul_job *job = p;
    const size_t n = (size_t)job->n_in;
    (void)cpu_x86_to_bf16(job->x + (size_t)begin * n, job->ctx->act_bf16 + (size_t)begin * n,
                          (size_t)(end - begin) * n);
}

/* The call's activations as bf16 in ctx->act_bf16 (the BF16 kernels' mode). */
static int bf16_prepare(matmul_job *job)
{
    cpu_ctx *ctx = job->ctx;
    const size_t need = (size_t)job->T * (size_t)job->n_in;
    if (need > ctx->act_bf16_cap) {
        uint16_t *b = malloc(need * sizeof *b);
        if (!b)
            return CAIRN_ENOMEM;
        free(ctx->act_bf16);
        ctx->act_bf16 = b;
        ctx->act_bf16_cap = need;
    }
    cpu_pool_parallel_for(ctx->pool, job->T, 1 + CPU_MIN_CHUNK_WORK / job->n_in, bf16_range, job);
    return CAIRN_OK;
}

static void quantize_act_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const matmul_job *job = p;
    cpu_ctx *ctx = job->ctx;
    const int nb = job->n_in / 32;
    for (int64_t t = begin; t < end; t++) {
        const float *x = job->x + (size_t)t * job->n_in;
        const size_t e0 = cpu_act_index(nb, (int)t, 0);
        int8_t *q = ctx->act_q + 32 * e0;
        float *d = ctx->act_d + e0;
        int32_t *s = ctx->act_s + e0, *s_lo = ctx->act_s_lo + e0;
        if (cpu_x86_quantize_act(ctx->isa, x, job->n_in, q, 32 * CPU_ACT_TILE, d, s, s_lo,
                                 CPU_ACT_TILE))
            continue;
        for (int b = 0; b < nb; b++) {
            const size_t o = (size_t)b * CPU_ACT_TILE;
            cpu_quantize_act_block_ref(x + 32 * b, q + 32 * o, d + o, s + o, s_lo + o);
        }
    }
}

/* Room for the quantized activations of T tokens of n_in (whole tiles). */
static int reserve_act(cpu_ctx *ctx, int T, int n_in)
{
    const size_t entries =
        (size_t)((T + CPU_ACT_TILE - 1) / CPU_ACT_TILE) * CPU_ACT_TILE * (size_t)(n_in / 32);
    if (entries <= ctx->act_cap)
        return CAIRN_OK;
    void *q = NULL;
    if (posix_memalign(&q, 64, 32 * entries) != 0)
        return CAIRN_ENOMEM;
    float *d = malloc(entries * sizeof(float));
    int32_t *s = malloc(entries * sizeof(int32_t)), *s_lo = malloc(entries * sizeof(int32_t));
    int32_t *corr = malloc((size_t)CPU_MULTI_MAX * 3 * entries * sizeof(int32_t));
    if (!d || !s || !s_lo || !corr) {
        free(q), free(d), free(s), free(s_lo), free(corr);
        return CAIRN_ENOMEM;
    }
    free(ctx->act_q), free(ctx->act_d), free(ctx->act_s), free(ctx->act_s_lo);
    free(ctx->act_corr);
    ctx->act_q = q;
    ctx->act_d = d;
    ctx->act_s = s;
    ctx->act_s_lo = s_lo;
    ctx->act_corr = corr;
    ctx->act_cap = entries;
    return CAIRN_OK;
}

/* The job's view of the quantized activations, with the corrections of
 * its weight type in correction set `slot` (cpu_act in cpu_impl.h): a
 * pass over the call's T x nb entries, on the calling thread. */
static void act_bind(matmul_job *job, int slot)
{
    cpu_ctx *ctx = job->ctx;
    const int nb = job->n_in / 32;
    int32_t *zi = ctx->act_corr + (size_t)slot * 3 * ctx->act_cap;
    int32_t *zi2 = zi + ctx->act_cap;
    float *zf = (float *)(zi2 + ctx->act_cap);
    job->act = (cpu_act){.q = ctx->act_q, .d = ctx->act_d, .s = ctx->act_s,
                         .s_lo = ctx->act_s_lo, .zi = zi, .zi2 = zi2, .zf = zf, .nb = nb};
    const cairn_type t = job->wtype;
    const int zero = t == CAIRN_TYPE_Q4_0    ? 8
                   : t == CAIRN_TYPE_Q5_0    ? 16
                   : t == CAIRN_TYPE_MXFP4   ? CPU_MXFP4_ZERO
                                             : 128;
    for (int tok = 0; tok < job->T; tok++) {
        const size_t e0 = cpu_act_index(nb, tok, 0);
        for (int b = 0; b < nb; b++) {
            const size_t e = e0 + (size_t)b * CPU_ACT_TILE;
            const int32_t sa = ctx->act_s[e];
            if (t == CAIRN_TYPE_Q4_K || t == CAIRN_TYPE_Q5_K)
                zf[e] = -ctx->act_d[e] * (float)sa;
            else if (t == CAIRN_TYPE_Q6_K) {
                zi[e] = -32 * ctx->act_s_lo[e];
                zi2[e] = -32 * (sa - ctx->act_s_lo[e]);
            } else if (t == CAIRN_TYPE_Q4_Z)
                zi[e] = sa;
            else
                zi[e] = -zero * sa;
        }
    }
}

/* Check one matmul's arguments and fill *job (GGUF type, packed flag, the
 * packed geometry where the type has one). */
static int job_init(matmul_job *job, cpu_ctx *ctx, float *y, const void *W, cairn_type wtype,
                    const float *x, int T, int n_in, int n_out)
{
    if (!y || !W || !x || T <= 0 || n_in <= 0 || n_out <= 0)
        return CAIRN_EINVAL;
    const int packed = cpu_is_packed(wtype);
    wtype = cpu_unpacked_type(wtype);
    if (!cpu_type_supported(wtype) || !row_shape_ok(wtype, n_in))
        return CAIRN_EINVAL;
    /* y is written while x is still being read. */
    if ((const float *)y == x)
        return CAIRN_EINVAL;
    *job = (matmul_job){
        .ctx = ctx, .y = y, .W = W, .wtype = wtype, .packed = packed, .x = x,
        .T = T, .n_in = n_in, .n_out = n_out,
        .row_bytes = cairn_type_row_bytes(wtype, n_in),
        .rows_per_item = 1,
    };
    const int has_geom = cpu_pack_geom_init(&job->geom, wtype, n_in);
    if (packed && !has_geom)
        return CAIRN_EINVAL; /* no such packed layout */
    if (cpu_q8act_type(wtype) && !has_geom)
        return CAIRN_EINVAL;
    return CAIRN_OK;
}

/* The quantized path's preparation, shared by the parts of a multi call:
 * the activations quantized once, and scratch for two groups or a row of
 * the widest part. */
static int q8act_prepare(cpu_ctx *ctx, matmul_job *jobs, int n)
{
    const matmul_job *job = &jobs[0];
    int rc;
    if ((rc = reserve_act(ctx, job->T, job->n_in)) != CAIRN_OK)
        return rc;
    size_t scratch = 0;
    for (int i = 0; i < n; i++) {
        const size_t need = 2 * jobs[i].geom.group_bytes > jobs[i].row_bytes
                                ? 2 * jobs[i].geom.group_bytes
                                : jobs[i].row_bytes;
        scratch = need > scratch ? need : scratch;
    }
    if ((rc = cpu_scratch_reserve(ctx, scratch / sizeof(float) + 16)) != CAIRN_OK)
        return rc;
    cpu_pool_parallel_for(ctx->pool, job->T, 1 + CPU_MIN_CHUNK_WORK / job->n_in,
                          quantize_act_range, (void *)job);
    for (int i = 0; i < n; i++)
        act_bind(&jobs[i], i);
    return CAIRN_OK;
}

int cpu_matmul(cairn_backend *be, float *y, const void *W, cairn_type wtype, const float *x,
               int T, int n_in, int n_out)
{
    if (!be)
        return CAIRN_EINVAL;
    cpu_ctx *ctx = cpu_ctx_of(be);
    matmul_job job;
    int rc = job_init(&job, ctx, y, W, wtype, x, T, n_in, n_out);
    if (rc != CAIRN_OK)
        return rc;
    const int64_t work_per_row = (int64_t)n_in * T;
    const int quantized = cpu_q8act_type(job.wtype);

    if (quantized && ctx->quantize_activations) {
        if ((rc = q8act_prepare(ctx, &job, 1)) != CAIRN_OK)
            return rc;
        const int64_t n_items = (n_out + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS;
        cpu_pool_parallel_for(ctx->pool, n_items,
                              1 + CPU_MIN_CHUNK_WORK / (work_per_row * CPU_PACK_ROWS),
                              matmul_q8act_range, &job);
        return CAIRN_OK;
    }
    if (!quantized && job.packed) {
        /* packed F16/BF16: only an AVX-512 backend packs them */
        if (ctx->isa < CPU_ISA_AVX512)
            return CAIRN_EINVAL;
        if (job.wtype == CAIRN_TYPE_BF16 && ctx->bf16_dot && (rc = bf16_prepare(&job)) != CAIRN_OK)
            return rc;
        const int64_t n_items = (n_out + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS;
        cpu_pool_parallel_for(ctx->pool, n_items,
                              1 + CPU_MIN_CHUNK_WORK / (work_per_row * CPU_PACK_ROWS),
                              matmul_float_packed_range, &job);
        return CAIRN_OK;
    }
    if (!quantized && ctx->isa >= CPU_ISA_AVX2) {
        const size_t panel = cpu_x86_float_panel_floats(ctx->isa, job.wtype, T, n_in);
        if (panel > 0 && (rc = cpu_scratch_reserve(ctx, panel)) != CAIRN_OK)
            return rc;
        job.rows_per_item = cpu_x86_float_rows_per_item(ctx->isa, T);
        const int64_t n_items = (n_out + job.rows_per_item - 1) / job.rows_per_item;
        cpu_pool_parallel_for(ctx->pool, n_items,
                              1 + CPU_MIN_CHUNK_WORK / (work_per_row * job.rows_per_item),
                              matmul_float_range, &job);
        return CAIRN_OK;
    }

    if (job.wtype != CAIRN_TYPE_F32 || job.packed) {
        rc = cpu_scratch_reserve(ctx, (size_t)n_in + job.row_bytes / sizeof(float) + 1);
        if (rc != CAIRN_OK)
            return rc;
    }
    cpu_pool_parallel_for(ctx->pool, n_out, 1 + CPU_MIN_CHUNK_WORK / work_per_row, matmul_range,
                          &job);
    return CAIRN_OK;
}

/* ---- matmul_multi ------------------------------------------------------- */

typedef struct {
    matmul_job jobs[CPU_MULTI_MAX];
    int n;
    cpu_range_fn range; /* every part's: quantized, or packed float */
    int64_t first[CPU_MULTI_MAX + 1]; /* item ranges: part i has [first[i], first[i+1]) */
} multi_job;

/* Items of all parts, one after the other: each range is cut at the parts'
 * boundaries and handed to the part's own range function, so every output
 * is computed exactly as its matmul call would. */
static void multi_range(void *p, int64_t begin, int64_t end, int thread)
{
    const multi_job *mj = p;
    for (int i = 0; i < mj->n; i++) {
        const int64_t b = begin > mj->first[i] ? begin : mj->first[i];
        const int64_t e = end < mj->first[i + 1] ? end : mj->first[i + 1];
        if (b < e)
            mj->range((void *)&mj->jobs[i], b - mj->first[i], e - mj->first[i], thread);
    }
}

int cpu_matmul_multi(cairn_backend *be, const float *x, int T, int n_in, int n,
                     const cairn_matmul_part *parts)
{
    if (!be || !parts || n < 1)
        return CAIRN_EINVAL;
    cpu_ctx *ctx = cpu_ctx_of(be);
    multi_job mj = {.n = n};
    /* one pass when every part takes the same path: all quantized (the
     * activations quantized once), or all packed F16/BF16 (converted to
     * bf16 once where the BF16 kernels want it) */
    int n_q8 = 0, n_pf = 0;
    for (int i = 0; i < n && n <= CPU_MULTI_MAX; i++) {
        int rc = job_init(&mj.jobs[i], ctx, parts[i].y, parts[i].W, parts[i].wtype, x, T, n_in,
                          parts[i].n_out);
        if (rc != CAIRN_OK)
            return rc;
        n_q8 += cpu_q8act_type(mj.jobs[i].wtype) && ctx->quantize_activations;
        n_pf += mj.jobs[i].packed && !cpu_q8act_type(mj.jobs[i].wtype) &&
                ctx->isa >= CPU_ISA_AVX512;
        for (int j = 0; j < i; j++)
            if (parts[j].y == parts[i].y)
                return CAIRN_EINVAL;
    }
    if (n > CPU_MULTI_MAX || (n_q8 != n && n_pf != n)) { /* one call each */
        for (int i = 0; i < n; i++) {
            int rc = cpu_matmul(be, parts[i].y, parts[i].W, parts[i].wtype, x, T, n_in,
                                parts[i].n_out);
            if (rc != CAIRN_OK)
                return rc;
        }
        return CAIRN_OK;
    }
    int rc = CAIRN_OK;
    if (n_q8 == n) {
        mj.range = matmul_q8act_range;
        rc = q8act_prepare(ctx, mj.jobs, n);
    } else {
        mj.range = matmul_float_packed_range;
        for (int i = 0; i < n && rc == CAIRN_OK; i++)
            if (mj.jobs[i].wtype == CAIRN_TYPE_BF16 && ctx->bf16_dot) {
                rc = bf16_prepare(&mj.jobs[i]);
                break;
            }
    }
    if (rc != CAIRN_OK)
        return rc;
    mj.first[0] = 0;
    for (int i = 0; i < n; i++)
        mj.first[i + 1] = mj.first[i] + (parts[i].n_out + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS;
    const int64_t work_per_item = (int64_t)n_in * T * CPU_PACK_ROWS;
    cpu_pool_parallel_for(ctx->pool, mj.first[n], 1 + CPU_MIN_CHUNK_WORK / work_per_item,
                          multi_range, &mj);
    return CAIRN_OK;
}
