/*
 * kernels/cpu/cpu_attention.c — writing K/V into the paged pool and attention
 * over it.
 *
 * Two kernels:
 *   - the vector kernel (AVX-512; cpu_impl.h "The vector attention kernel"):
 *     one pass over the keys with a running maximum, in 16-key tiles and
 *     512-key chunks at fixed key positions. A work item is a block of query
 *     rows of one sequence times the query heads of one KV head, so K/V are
 *     read once per block. When a call has few such items and long contexts
 *     (decode), its chunks become items of their own and a second pass
 *     folds them per row; the arithmetic is the same either way.
 *   - the scalar reference (and AVX2 helpers), per (query row, query head):
 *     two-pass, first every visible score s_j = scale * q·k_j and their
 *     maximum, then softmax weights exp(s_j - max) and the weighted sum of V.
 * Items are independent, so the work is split over all items of all
 * sequences at once (a decode step of many sequences and a long prefill both
 * keep every thread busy).
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

/* x[n] <- H_R x on each run of R elements (R a power of two): the
 * orthonormal Walsh-Hadamard transform of the rotated KV types
 * (kernels/backend.h "KV types"). H_R is symmetric and its own inverse, so
 * the same call rotates K and V on the way in, the query before scoring and
 * the output back. */
static void hadamard_runs(float *x, int n, int R)
{
    const float norm = 1.0f / sqrtf((float)R);
    for (int base = 0; base < n; base += R) {
        float *r = x + base;
        for (int len = 1; len < R; len *= 2)
            for (int i = 0; i < R; i += 2 * len)
                for (int j = i; j < i + len; j++) {
                    const float a = r[j], b = r[j + len];
                    r[j] = a + b;
                    r[j + len] = a - b;
                }
        for (int j = 0; j < R; j++)
            r[j] *= norm;
    }
}

/* The widest head the block types take here (a stack buffer per head). */
#define KV_HEAD_MAX 1024

/* A row of n_kv_head heads in a block type or rotated: each head rotated,
 * then quantized with the reference quantizer (common/quant.c). */
static void store_row_heads(uint8_t *dst, const float *src, const cairn_kv_layout *L)
{
    const int hd = L->head_dim;
    const size_t head_bytes = cairn_kv_head_bytes(L->dtype, hd);
    float head[KV_HEAD_MAX];
    for (int h = 0; h < L->n_kv_head; h++) {
        memcpy(head, src + (size_t)h * hd, (size_t)hd * sizeof(float));
        if (L->rotation)
            hadamard_runs(head, hd, L->rotation);
        cairn_quantize_row(L->dtype, head, dst + (size_t)h * head_bytes, hd);
    }
}

/* The F32/F16 unrotated layouts take the plain row copies below; every
 * other KV type goes through store_row_heads and the scalar attention. */
static int kv_plain(const cairn_kv_layout *L)
{
    return (L->dtype == CAIRN_TYPE_F32 || L->dtype == CAIRN_TYPE_F16) && !L->rotation;
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
        if (!kv_plain(L)) {
            store_row_heads(k_dst, job->k + (size_t)t * (size_t)width, L);
            store_row_heads(v_dst, job->v + (size_t)t * (size_t)width, L);
            continue;
        }
        store_row(k_dst, job->k + (size_t)t * (size_t)width, width, L->dtype, job->isa);
        store_row(v_dst, job->v + (size_t)t * (size_t)width, width, L->dtype, job->isa);
    }
}

int cpu_kv_store(cairn_backend *be, void *kv_pool, const cairn_kv_layout *L, int layer,
                 const float *k, const float *v, const int32_t *slots, int T)
{
    if (!be || cairn_kv_store_args_check(kv_pool, L, layer, k, v, slots, T) != CAIRN_OK)
        return CAIRN_EINVAL;
    if (!kv_plain(L) && L->head_dim > KV_HEAD_MAX)
        return CAIRN_EUNSUPPORTED;
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
} attn_job;

/* Dot product of a float query with one K row of the pool. */
static inline float dot_q_k(const float *q, const uint8_t *k, int n, cairn_type dtype)
{
    if (dtype == CAIRN_TYPE_F32)
        return cpu_dot_f32(q, (const float *)k, n);
    if (dtype != CAIRN_TYPE_F16) { /* BF16, Q8_0, Q4_0: the reference decoder */
        float row[KV_HEAD_MAX];
        cairn_dequantize_row(dtype, k, row, n);
        return cpu_dot_f32(q, row, n);
    }
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
    } else if (dtype != CAIRN_TYPE_F16) {
        float row[KV_HEAD_MAX];
        cairn_dequantize_row(dtype, v, row, n);
        for (int d = 0; d < n; d++)
            acc[d] += w * row[d];
    } else {
        const uint16_t *vh = (const uint16_t *)v;
        for (int d = 0; d < n; d++)
            acc[d] += w * cpu_half_to_float(vh[d]);
    }
}


/* What multiplies the accumulated Σ e^{s_j - m} v_j of a vector whose
 * visible scores have maximum m and Σ e^{s_j - m} = l: 1 / l, or with an
 * attention sink (kernels/backend.h, cairn_attn_args.sinks) the softmax
 * that also counts e^{sink}, taken about max(m, sink) so neither term can
 * overflow. Nothing visible (m = -inf): 0, the sink takes it all. */
static float attn_norm(float m, float l, const float *sinks, int head)
{
    if (m == -INFINITY)
        return 0.0f;
    if (!sinks)
        return 1.0f / l;
    const float sink = sinks[head], top = m > sink ? m : sink;
    const float f = expf(m - top);
    return f / (l * f + expf(sink - top));
}

/* The first key row i of seq may see: past the keys a sliding window
 * (args->window > 0) leaves behind, else 0 (q_index, which a mask without
 * a window may leave NULL, is read only with a window). */
static int window_start(const cairn_attn_args *a, const cairn_attn_seq *seq, int i)
{
    const int lo = a->window > 0 ? seq->q_index[i] - a->window + 1 : 0;
    return lo > 0 ? lo : 0;
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
    const size_t head_off = (size_t)kv_head * cairn_kv_head_bytes(L->dtype, hd);
    const size_t q_off = ((size_t)(seq->q_start + i) * (size_t)a->n_head + (size_t)h) * (size_t)hd;
    const uint8_t *pool = a->kv_pool;
    const uint8_t *mask = seq->mask ? seq->mask + (size_t)i * (size_t)seq->n_kv : NULL;
    /* Without a mask the query sees the causal prefix 0 .. q_index[i]. */
    const int n_scan = mask ? seq->n_kv : seq->q_index[i] + 1;
    /* A sliding window starts the scan at the window's first key. */
    const int j0 = window_start(a, seq, i);

    float *scores = scratch;                       /* [n_kv]     */
    float *q = scratch + ((seq->n_kv + 15) / 16 * 16); /* [head_dim] */
    float *acc = q + ((hd + 15) / 16 * 16);        /* [head_dim] */
    memcpy(q, a->q + q_off, (size_t)hd * sizeof(float));
    if (L->rotation) /* q·k = (H q)·(H k): the pool holds H k */
        hadamard_runs(q, hd, L->rotation);

    /* Pass 1: scores of the visible entries and their maximum. */
    float max = -INFINITY;
    int any_visible = 0;
    for (int j = j0; j < n_scan; j++) {
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
        for (int j = j0; j < n_scan; j++) {
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
    const float inv = any_visible && sum > 0.0f ? attn_norm(max, sum, a->sinks, h) : 0.0f;
    if (L->rotation) /* Σ p_j H v_j = H Σ p_j v_j: back to the model's basis */
        hadamard_runs(acc, hd, L->rotation);
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
    int64_t row = begin / a->n_head;
    int lo = 0, hi = a->n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (job->row_start[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    int s = lo;
    for (int64_t item = begin; item < end; item++) {
        row = item / a->n_head;
        const int h = (int)(item % a->n_head);
        while (row >= job->row_start[s + 1])
            s++;
        attend_one(job, &a->seqs[s], (int)(row - job->row_start[s]), h, scratch);
    }
}

/* ---- the vector kernel's driver ------------------------------------------- */

/* Query rows per item: whole lane groups of 16 vectors (rows x heads of
 * one KV head), at least 64 vectors, so each converted K/V tile serves many
 * vectors without the item's states outgrowing L2. */
static int rows_per_item(int group)
{
    int rows = 1;
    while (rows * group % 16 != 0 && rows < 16)
        rows *= 2;
    while (rows * group < 64)
        rows *= 2;
    return rows;
}

typedef struct {
    cpu_ctx *ctx;
    const cairn_attn_args *a;
    cpu_attend_chunk_fn chunk_fn;
    const int64_t *block_start; /* [n_seqs + 1] first row block of each sequence */
    int rows;                   /* rows per block */
    int max_chunks;             /* chunks of the longest sequence */
    float *partial;             /* split: [items][max_chunks][item_floats] states */
    size_t item_floats;         /* one item's states: lane groups * state floats */
    size_t qt_floats;           /* one item's transposed queries */
} flash_job;

/* Fold one chunk's partial states into the running ones, in key order:
 * the same function (and so the same arithmetic) whether the chunks ran in
 * one item or as items of their own. Per lane, scalar libm exp, no
 * contraction (ISO C), so a lane's result is its vector's alone. */
static void attn_fold(float *run, const float *part, int n_groups, int hd)
{
    const size_t stride = cpu_attn_state_floats(hd);
    for (int g = 0; g < n_groups; g++, run += stride, part += stride) {
        float *rm = run + (size_t)hd * 16, *rl = rm + 16;
        const float *pm = part + (size_t)hd * 16, *pl = pm + 16;
        for (int lane = 0; lane < 16; lane++) {
            if (pm[lane] == -INFINITY)
                continue; /* the chunk showed this vector nothing */
            const float m = pm[lane] > rm[lane] ? pm[lane] : rm[lane];
            const float alpha = expf(rm[lane] - m), beta = expf(pm[lane] - m);
            rl[lane] = rl[lane] * alpha + pl[lane] * beta;
            for (int d = 0; d < hd; d++)
                run[(size_t)d * 16 + lane] =
                    run[(size_t)d * 16 + lane] * alpha + part[(size_t)d * 16 + lane] * beta;
            rm[lane] = m;
        }
    }
}

/* The sequence of row block `block`. */
static int block_seq(const flash_job *job, int64_t block)
{
    int lo = 0, hi = job->a->n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (job->block_start[mid] <= block)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Per-thread scratch of the driver, in this order: the K/V tile, the
 * transposed queries, two item states (a chunk's and the running fold), the
 * rows' n_scan and n_skip. */
typedef struct {
    float *kv_tile, *q_t, *part, *run;
    int32_t *n_scan, *n_skip;
} flash_scratch;

static flash_scratch scratch_of(const flash_job *job, int thread)
{
    flash_scratch f;
    f.kv_tile = cpu_scratch_of(job->ctx, thread);
    f.q_t = f.kv_tile + 2 * (size_t)CPU_ATTN_TILE * job->a->kv->head_dim;
    f.part = f.q_t + job->qt_floats;
    f.run = f.part + job->item_floats;
    f.n_scan = (int32_t *)(f.run + job->item_floats);
    f.n_skip = f.n_scan + (size_t)(job->rows + 15) / 16 * 16;
    return f;
}

static size_t flash_scratch_floats(const flash_job *job)
{
    return 2 * (size_t)CPU_ATTN_TILE * job->a->kv->head_dim + job->qt_floats +
           2 * job->item_floats + 2 * ((size_t)(job->rows + 15) / 16 * 16);
}

/* The item of (row block, KV head) `item`. */
static void flash_item(const flash_job *job, int64_t item, const flash_scratch *f, cpu_attn_item *it)
{
    const cairn_attn_args *a = job->a;
    const cairn_kv_layout *L = a->kv;
    const int64_t block = item / L->n_kv_head;
    const int kvh = (int)(item % L->n_kv_head);
    const int s = block_seq(job, block);
    const cairn_attn_seq *seq = &a->seqs[s];
    const int r0 = (int)(block - job->block_start[s]) * job->rows;
    const int n_rows = seq->n_q - r0 < job->rows ? seq->n_q - r0 : job->rows;
    const int group = a->n_head / L->n_kv_head;
    for (int r = 0; r < n_rows; r++) {
        f->n_scan[r] = seq->mask ? seq->n_kv : seq->q_index[r0 + r] + 1;
        f->n_skip[r] = window_start(a, seq, r0 + r);
    }
    *it = (cpu_attn_item){
        .L = L, .pool = a->kv_pool, .layer = a->layer,
        .head_off = (size_t)kvh * L->head_dim * (L->dtype == CAIRN_TYPE_F32 ? 4 : 2),
        .pages = seq->pages, .scale = a->scale, .group = group, .n_rows = n_rows,
        .q = a->q + ((size_t)(seq->q_start + r0) * a->n_head + (size_t)kvh * group) * L->head_dim,
        .row_stride = (size_t)a->n_head * L->head_dim,
        .n_scan = f->n_scan,
        .n_skip = f->n_skip,
        .mask = seq->mask ? seq->mask + (size_t)r0 * seq->n_kv : NULL,
        .mask_stride = (size_t)seq->n_kv,
        .kv_tile = f->kv_tile, .q_t = f->q_t,
    };
}

static int item_groups(const cpu_attn_item *it)
{
    return cpu_attn_lane_groups(it->n_rows * it->group);
}

/* out = acc / l for every vector of the item (zeros where nothing was
 * visible: m still -inf). */
static void flash_write(const flash_job *job, const cpu_attn_item *it, const float *st)
{
    const int hd = job->a->kv->head_dim;
    const size_t stride = cpu_attn_state_floats(hd);
    float *out = job->a->out + (it->q - job->a->q);
    const int n_vec = it->n_rows * it->group;
    /* the item's first query head: its vectors are rows x heads of one KV head */
    const int head0 = (int)((size_t)(it->q - job->a->q) / (size_t)hd % (size_t)job->a->n_head);
    for (int v = 0; v < n_vec; v++) {
        const float *g = st + (size_t)(v / 16) * stride;
        const int lane = v % 16;
        const float m = g[(size_t)hd * 16 + lane], l = g[(size_t)hd * 16 + 16 + lane];
        const float inv = attn_norm(m, l, job->a->sinks, head0 + v % it->group);
        float *o = out + (size_t)(v / it->group) * it->row_stride + (size_t)(v % it->group) * hd;
        for (int d = 0; d < hd; d++)
            o[d] = g[(size_t)d * 16 + lane] * inv;
    }
}

/* The chunks of rows whose keys are [skip, scan) at the widest (the
 * smallest n_skip, the largest n_scan): the first with a key some row may
 * see (0 unless a sliding window starts past it; the chunks before show
 * nothing, so leaving them out changes no bit of the fold), and how many
 * to run from it. */
static int chunk_range(int skip, int scan, int *first)
{
    *first = skip / CPU_ATTN_CHUNK;
    return (scan + CPU_ATTN_CHUNK - 1) / CPU_ATTN_CHUNK - *first;
}

/* chunk_range of an item's rows. */
static int item_chunks(const cpu_attn_item *it, int *first)
{
    int skip = it->n_skip[0], scan = 0;
    for (int r = 0; r < it->n_rows; r++) {
        scan = it->n_scan[r] > scan ? it->n_scan[r] : scan;
        skip = it->n_skip[r] < skip ? it->n_skip[r] : skip;
    }
    return chunk_range(skip, scan, first);
}

/* Whole items: every chunk of a (row block, KV head), folded as it goes. */
static void flash_whole_range(void *p, int64_t begin, int64_t end, int thread)
{
    const flash_job *job = p;
    const int hd = job->a->kv->head_dim;
    const flash_scratch f = scratch_of(job, thread);
    for (int64_t item = begin; item < end; item++) {
        cpu_attn_item it;
        flash_item(job, item, &f, &it);
        const int n_groups = item_groups(&it);
        cpu_attn_state_clear(f.run, n_groups, hd);
        int first;
        const int chunks = item_chunks(&it, &first);
        for (int c = 0; c < chunks; c++) {
            job->chunk_fn(&it, first + c, f.part);
            attn_fold(f.run, f.part, n_groups, hd);
        }
        flash_write(job, &it, f.run);
    }
}

/* Split, pass 1: one chunk of one (row block, KV head) into job->partial. */
static void flash_chunk_range(void *p, int64_t begin, int64_t end, int thread)
{
    const flash_job *job = p;
    const flash_scratch f = scratch_of(job, thread);
    for (int64_t w = begin; w < end; w++) {
        cpu_attn_item it;
        flash_item(job, w / job->max_chunks, &f, &it);
        const int c = (int)(w % job->max_chunks);
        float *part = job->partial + (size_t)w * job->item_floats;
        int first;
        if (c < item_chunks(&it, &first))
            job->chunk_fn(&it, first + c, part);
        else
            cpu_attn_state_clear(part, item_groups(&it), job->a->kv->head_dim);
    }
}

/* Split, pass 2: fold each item's chunks in order and write its rows. */
static void flash_fold_range(void *p, int64_t begin, int64_t end, int thread)
{
    const flash_job *job = p;
    const int hd = job->a->kv->head_dim;
    const flash_scratch f = scratch_of(job, thread);
    for (int64_t item = begin; item < end; item++) {
        cpu_attn_item it;
        flash_item(job, item, &f, &it);
        const int n_groups = item_groups(&it);
        cpu_attn_state_clear(f.run, n_groups, hd);
        for (int c = 0; c < job->max_chunks; c++)
            attn_fold(f.run, job->partial + ((size_t)item * job->max_chunks + c) * job->item_floats,
                      n_groups, hd);
        flash_write(job, &it, f.run);
    }
}

static int grow_seq_table(cpu_ctx *ctx, int n_seqs)
{
    if (ctx->seq_row_cap < n_seqs + 1) {
        int64_t *grown = realloc(ctx->seq_row_start, sizeof(int64_t) * (size_t)(n_seqs + 1));
        if (!grown)
            return CAIRN_ENOMEM;
        ctx->seq_row_start = grown;
        ctx->seq_row_cap = n_seqs + 1;
    }
    return CAIRN_OK;
}

static int flash_attention(cpu_ctx *ctx, const cairn_attn_args *a, cpu_attend_chunk_fn chunk_fn)
{
    const cairn_kv_layout *L = a->kv;
    const int group = a->n_head / L->n_kv_head, hd = L->head_dim;
    const int rows = rows_per_item(group);
    int rc = grow_seq_table(ctx, a->n_seqs);
    if (rc != CAIRN_OK)
        return rc;
    int64_t n_blocks = 0;
    int max_chunks = 0; /* chunks any item runs (item_chunks): its sequence's at most */
    for (int s = 0; s < a->n_seqs; s++) {
        const cairn_attn_seq *seq = &a->seqs[s];
        ctx->seq_row_start[s] = n_blocks;
        n_blocks += (seq->n_q + rows - 1) / rows;
        int scan = seq->mask ? seq->n_kv : 0, skip = seq->n_kv, first;
        for (int i = 0; i < seq->n_q; i++) {
            if (!seq->mask && seq->q_index[i] + 1 > scan)
                scan = seq->q_index[i] + 1;
            const int lo = window_start(a, seq, i);
            skip = lo < skip ? lo : skip;
        }
        const int chunks = chunk_range(skip, scan, &first);
        max_chunks = chunks > max_chunks ? chunks : max_chunks;
    }
    ctx->seq_row_start[a->n_seqs] = n_blocks;
    const int n_groups = cpu_attn_lane_groups(rows * group);
    flash_job job = {
        .ctx = ctx, .a = a, .chunk_fn = chunk_fn, .block_start = ctx->seq_row_start,
        .rows = rows,
        .max_chunks = max_chunks > 0 ? max_chunks : 1,
        .item_floats = (size_t)n_groups * cpu_attn_state_floats(hd),
        .qt_floats = (size_t)n_groups * 16 * hd,
    };
    rc = cpu_scratch_reserve(ctx, flash_scratch_floats(&job));
    if (rc != CAIRN_OK)
        return rc;
    const int64_t n_items = n_blocks * L->n_kv_head;
    /* Few items over long contexts (decode): give every chunk to a thread of
     * its own, or the call would run on n_items threads at most. */
    const int split = job.max_chunks > 1 && n_items < 4 * (int64_t)ctx->n_threads;
    if (!split) {
        cpu_pool_parallel_for(ctx->pool, n_items, 1, flash_whole_range, &job);
        return CAIRN_OK;
    }
    const size_t need = (size_t)n_items * job.max_chunks * job.item_floats;
    if (ctx->attn_partial_cap < need) {
        void *mem = NULL;
        if (posix_memalign(&mem, 64, need * sizeof(float)) != 0)
            return CAIRN_ENOMEM;
        free(ctx->attn_partial);
        ctx->attn_partial = mem;
        ctx->attn_partial_cap = need;
    }
    job.partial = ctx->attn_partial;
    cpu_pool_parallel_for(ctx->pool, n_items * job.max_chunks, 1, flash_chunk_range, &job);
    cpu_pool_parallel_for(ctx->pool, n_items, 1, flash_fold_range, &job);
    return CAIRN_OK;
}

int cpu_attention(cairn_backend *be, const cairn_attn_args *a)
{
    int max_kv = 0;
    if (!be || cairn_attn_args_check(a, &max_kv) != CAIRN_OK)
        return CAIRN_EINVAL;
    const cairn_kv_layout *L = a->kv;
    if (!kv_plain(L) && L->head_dim > KV_HEAD_MAX)
        return CAIRN_EUNSUPPORTED;

    cpu_ctx *ctx = cpu_ctx_of(be);
    cpu_attend_chunk_fn chunk_fn = cpu_x86_attend_chunk(ctx->isa, L);
    const int group = a->n_head / L->n_kv_head;
    /* The flash kernel reads F32/F16 pages (with or without a window); the
     * other KV types take the two-pass kernel below (scalar for the block
     * types). */
    if (!kv_plain(L))
        chunk_fn = NULL;
    const int plain_rows = L->dtype == CAIRN_TYPE_F32 || L->dtype == CAIRN_TYPE_F16;
    if (chunk_fn && cpu_attn_lane_groups(rows_per_item(group) * group) <= CPU_ATTN_LANE_GROUPS_MAX)
        return flash_attention(ctx, a, chunk_fn);
    /* Scratch per thread: scores [max_kv] plus query copy and accumulator,
     * each padded to whole cache lines as attend_one lays them out. */
    size_t scratch = (size_t)(max_kv + 15) / 16 * 16 + 2 * ((size_t)(L->head_dim + 15) / 16 * 16);
    int rc = cpu_scratch_reserve(ctx, scratch);
    if (rc == CAIRN_OK)
        rc = grow_seq_table(ctx, a->n_seqs);
    if (rc != CAIRN_OK)
        return rc;
    int64_t n_rows = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        ctx->seq_row_start[s] = n_rows;
        n_rows += a->seqs[s].n_q;
    }
    ctx->seq_row_start[a->n_seqs] = n_rows;

    attn_job job = {
        .ctx = ctx, .a = a, .row_start = ctx->seq_row_start,
        .group = group,
        /* vector kernels for the F32/F16 rows; the block types' rows are
         * decoded by the reference dequantizer (dot_q_k, axpy_v) */
        .dot = plain_rows ? cpu_x86_dot_kv(ctx->isa, L->dtype) : NULL,
        .axpy = plain_rows ? cpu_x86_axpy_kv(ctx->isa, L->dtype) : NULL,
    };
    /* An item costs about 2 * n_kv * head_dim multiply-adds. */
    int64_t work_per_item = 2 * (int64_t)max_kv * L->head_dim;
    cpu_pool_parallel_for(ctx->pool, n_rows * a->n_head, 1 + 16384 / work_per_item,
                          attention_range, &job);
    return CAIRN_OK;
}
