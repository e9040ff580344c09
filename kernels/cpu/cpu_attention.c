/*
 * kernels/cpu/cpu_attention.c — writing K/V into the paged pool and attention
 * over it.
 *
 * Attention is computed per (query row, query head) item, two-pass: first
 * every visible score s_j = scale * q·k_j and their maximum, then
 * softmax weights exp(s_j - max) and the weighted sum of V. Each item is
 * independent, so the work is split over all items of all sequences at once
 * (a decode step of many sequences and a long prefill both keep every thread
 * busy).
 *
 * Rules beyond kernels/backend.h:
 *   - A query row that sees no KV entry at all (an all-zero mask row) gets an
 *     all-zero output instead of NaNs.
 *   - Without a mask, q_index[i] must be in [0, n_kv): CAIRN_EINVAL otherwise.
 *     With a mask, q_index is not read and may be NULL.
 *   - Page ids must be >= 0 (checked) and inside the pool (cannot be checked:
 *     the pool's size is not an argument). KV slots in kv_store likewise.
 *   - out may be the same array as q (each item reads its query before it
 *     writes its output); other overlaps are not allowed.
 *   - kv_store's slots must be distinct within one call.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

/* Address of K (kv = 0) or V (kv = 1) of `layer` for token row `row` of
 * page `page`. */
static inline const uint8_t *kv_row_addr(const uint8_t *pool, const cairn_kv_layout *L, int layer,
                                         int kv, int32_t page, int row)
{
    return pool + (size_t)page * L->page_bytes + cairn_kv_offset(L, layer, kv, row);
}

/* ---- kv_store ---------------------------------------------------------- */

typedef struct {
    uint8_t *pool;
    const cairn_kv_layout *L;
    int layer;
    const float *k, *v;   /* [T][n_kv_head * head_dim] */
    const int32_t *slots; /* [T] */
    cpu_isa isa;
} kv_store_job;

static void store_row(uint8_t *dst, const float *src, int n, cairn_type dtype, cpu_isa isa)
{
    if (dtype == CAIRN_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (!cpu_x86_f32_to_f16(isa, (uint16_t *)dst, src, n)) {
        uint16_t *h = (uint16_t *)dst;
        for (int i = 0; i < n; i++)
            h[i] = cairn_fp32_to_fp16(src[i]);
    }
}

static void kv_store_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const kv_store_job *job = p;
    const cairn_kv_layout *L = job->L;
    const int width = L->n_kv_head * L->head_dim;
    for (int64_t t = begin; t < end; t++) {
        const int32_t slot = job->slots[t];
        const int32_t page = slot / L->page_size;
        const int row = slot % L->page_size;
        uint8_t *k_dst = (uint8_t *)kv_row_addr(job->pool, L, job->layer, 0, page, row);
        uint8_t *v_dst = (uint8_t *)kv_row_addr(job->pool, L, job->layer, 1, page, row);
        store_row(k_dst, job->k + (size_t)t * (size_t)width, width, L->dtype, job->isa);
        store_row(v_dst, job->v + (size_t)t * (size_t)width, width, L->dtype, job->isa);
    }
}

int cpu_kv_store(cairn_backend *be, void *kv_pool, const cairn_kv_layout *L, int layer,
                 const float *k, const float *v, const int32_t *slots, int T)
{
    if (!be || cairn_kv_store_args_check(kv_pool, L, layer, k, v, slots, T) != CAIRN_OK)
        return CAIRN_EINVAL;
    kv_store_job job = {.pool = kv_pool, .L = L, .layer = layer, .k = k, .v = v, .slots = slots,
                        .isa = cpu_ctx_of(be)->isa};
    int64_t min_chunk = 1 + 16384 / ((int64_t)L->n_kv_head * L->head_dim);
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, T, min_chunk, kv_store_range, &job);
    return CAIRN_OK;
}

/* ---- attention --------------------------------------------------------- */

typedef struct {
    cpu_ctx *ctx;
    const cairn_attn_args *a;
    const int64_t *row_start; /* [n_seqs + 1] first flattened query row of each sequence */
    int group;                /* query heads per KV head */
    cpu_dot_kv_fn dot;        /* vector q·k and acc += w·v, or NULL for the scalar ones */
    cpu_axpy_kv_fn axpy;
    cpu_attend_group_fn attend_group; /* when set, items are (row, KV head) */
} attn_job;

/* Dot product of a float query with one K row of the pool. */
static inline float dot_q_k(const float *q, const uint8_t *k, int n, cairn_type dtype)
{
    if (dtype == CAIRN_TYPE_F32)
        return cpu_dot_f32(q, (const float *)k, n);
    const uint16_t *kh = (const uint16_t *)k;
    float sum = 0.0f;
    for (int d = 0; d < n; d++)
        sum += q[d] * cpu_half_to_float(kh[d]);
    return sum;
}

/* acc[n] += w * v[n], v a V row of the pool. */
static inline void axpy_v(float *acc, float w, const uint8_t *v, int n, cairn_type dtype)
{
    if (dtype == CAIRN_TYPE_F32) {
        const float *vf = (const float *)v;
        for (int d = 0; d < n; d++)
            acc[d] += w * vf[d];
    } else {
        const uint16_t *vh = (const uint16_t *)v;
        for (int d = 0; d < n; d++)
            acc[d] += w * cpu_half_to_float(vh[d]);
    }
}

/* One query row `i` of sequence `seq`, query head `h`. Scratch holds the
 * scores [n_kv], then the query copy and the accumulator [head_dim] each. */
static void attend_one(const attn_job *job, const cairn_attn_seq *seq, int i, int h, float *scratch)
{
    const cairn_attn_args *a = job->a;
    const cairn_kv_layout *L = a->kv;
    const int hd = L->head_dim;
    const int ps = L->page_size;
    const int kv_head = h / job->group;
    const size_t head_off = (size_t)kv_head * (size_t)hd * (L->dtype == CAIRN_TYPE_F32 ? 4 : 2);
    const size_t q_off = ((size_t)(seq->q_start + i) * (size_t)a->n_head + (size_t)h) * (size_t)hd;
    const uint8_t *pool = a->kv_pool;
    const uint8_t *mask = seq->mask ? seq->mask + (size_t)i * (size_t)seq->n_kv : NULL;
    /* Without a mask the query sees the causal prefix 0 .. q_index[i]. */
    const int n_scan = mask ? seq->n_kv : seq->q_index[i] + 1;

    float *scores = scratch;                       /* [n_kv]     */
    float *q = scratch + ((seq->n_kv + 15) / 16 * 16); /* [head_dim] */
    float *acc = q + ((hd + 15) / 16 * 16);        /* [head_dim] */
    memcpy(q, a->q + q_off, (size_t)hd * sizeof(float));

    /* Pass 1: scores of the visible entries and their maximum. */
    float max = -INFINITY;
    int any_visible = 0;
    for (int j = 0; j < n_scan; j++) {
        if (mask && !mask[j])
            continue;
        const uint8_t *k = kv_row_addr(pool, L, a->layer, 0, seq->pages[j / ps], j % ps) + head_off;
        const float s = (job->dot ? job->dot(q, k, hd) : dot_q_k(q, k, hd, L->dtype)) * a->scale;
        scores[j] = s;
        max = s > max ? s : max;
        any_visible = 1;
    }

    /* Pass 2: softmax weights and the weighted sum of V. */
    for (int d = 0; d < hd; d++)
        acc[d] = 0.0f;
    float sum = 0.0f;
    if (any_visible) {
        for (int j = 0; j < n_scan; j++) {
            if (mask && !mask[j])
                continue;
            const float w = expf(scores[j] - max);
            sum += w;
            const uint8_t *v = kv_row_addr(pool, L, a->layer, 1, seq->pages[j / ps], j % ps) + head_off;
            if (job->axpy)
                job->axpy(acc, w, v, hd);
            else
                axpy_v(acc, w, v, hd, L->dtype);
        }
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    float *out = a->out + q_off;
    for (int d = 0; d < hd; d++)
        out[d] = acc[d] * inv;
}

static void attention_range(void *p, int64_t begin, int64_t end, int thread)
{
    const attn_job *job = p;
    const cairn_attn_args *a = job->a;
    float *scratch = cpu_scratch_of(job->ctx, thread);
    /* Find the sequence of the first item: the last one starting at or
     * before its row (binary search over the row starts). */
    int64_t row = begin / (job->attend_group ? a->kv->n_kv_head : a->n_head);
    int lo = 0, hi = a->n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (job->row_start[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    int s = lo;
    if (job->attend_group) {
        const cairn_kv_layout *L = a->kv;
        const int hd = L->head_dim;
        for (int64_t item = begin; item < end; item++) {
            row = item / L->n_kv_head;
            const int kvh = (int)(item % L->n_kv_head);
            while (row >= job->row_start[s + 1])
                s++;
            const cairn_attn_seq *seq = &a->seqs[s];
            const int i = (int)(row - job->row_start[s]);
            /* q and out by the sequence's own q_start, as attend_one: the
             * flattened row only finds the sequence (callers need not
             * list sequences in row order). */
            const size_t q_off =
                ((size_t)(seq->q_start + i) * a->n_head + (size_t)kvh * job->group) * hd;
            const cpu_attn_group g = {
                .L = L, .pool = a->kv_pool, .layer = a->layer,
                .head_off = (size_t)kvh * hd * (L->dtype == CAIRN_TYPE_F32 ? 4 : 2),
                .pages = seq->pages,
                .n_scan = seq->mask ? seq->n_kv : seq->q_index[i] + 1,
                .mask = seq->mask ? seq->mask + (size_t)i * seq->n_kv : NULL,
                .scale = a->scale, .group = job->group,
                .q = a->q + q_off, .out = a->out + q_off, .scratch = scratch,
            };
            job->attend_group(&g);
        }
        return;
    }
    for (int64_t item = begin; item < end; item++) {
        row = item / a->n_head;
        const int h = (int)(item % a->n_head);
        while (row >= job->row_start[s + 1])
            s++;
        attend_one(job, &a->seqs[s], (int)(row - job->row_start[s]), h, scratch);
    }
}

int cpu_attention(cairn_backend *be, const cairn_attn_args *a)
{
    int max_kv = 0;
    if (!be || cairn_attn_args_check(a, &max_kv) != CAIRN_OK)
        return CAIRN_EINVAL;
    const cairn_kv_layout *L = a->kv;

    cpu_ctx *ctx = cpu_ctx_of(be);
    /* Scratch per thread: scores [max_kv] plus query copy and accumulator,
     * each padded to whole cache lines as attend_one lays them out. */
    size_t scratch = (size_t)(max_kv + 15) / 16 * 16 + 2 * ((size_t)(L->head_dim + 15) / 16 * 16);
    const int group = a->n_head / L->n_kv_head;
    cpu_attend_group_fn attend_group = cpu_x86_attend_group(ctx->isa, L, group);
    if (attend_group)
        scratch = (size_t)group * ((size_t)(max_kv + 15) / 16 * 16 + 2 * (size_t)L->head_dim);
    int rc = cpu_scratch_reserve(ctx, scratch);
    if (rc != CAIRN_OK)
        return rc;
    if (ctx->seq_row_cap < a->n_seqs + 1) {
        int64_t *grown = realloc(ctx->seq_row_start, sizeof(int64_t) * (size_t)(a->n_seqs + 1));
        if (!grown)
            return CAIRN_ENOMEM;
        ctx->seq_row_start = grown;
        ctx->seq_row_cap = a->n_seqs + 1;
    }
    int64_t n_rows = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        ctx->seq_row_start[s] = n_rows;
        n_rows += a->seqs[s].n_q;
    }
    ctx->seq_row_start[a->n_seqs] = n_rows;

    attn_job job = {
        .ctx = ctx, .a = a, .row_start = ctx->seq_row_start,
        .group = a->n_head / L->n_kv_head,
        .dot = cpu_x86_dot_kv(ctx->isa, L->dtype),
        .axpy = cpu_x86_axpy_kv(ctx->isa, L->dtype),
        .attend_group = attend_group,
    };
    /* An item costs about 2 * n_kv * head_dim multiply-adds per head. */
    const int heads_per_item = attend_group ? group : 1;
    int64_t work_per_item = 2 * (int64_t)max_kv * L->head_dim * heads_per_item;
    cpu_pool_parallel_for(ctx->pool, n_rows * (a->n_head / heads_per_item),
                          1 + 16384 / work_per_item, attention_range, &job);
    return CAIRN_OK;
}
