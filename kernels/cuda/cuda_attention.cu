/*
 * kernels/cuda/cuda_attention.cu — scaled dot-product attention of query
 * rows over their sequence's paged KV, grouped-query, causal by q_index or
 * masked (EAGLE trees).
 *
 * One thread block per (query row, query head), walking the visible KV
 * entries in tiles of ATTN_TILE with an online softmax (running maximum m,
 * running sum l, accumulator rescaled by exp(m_old - m_new) whenever the
 * maximum grows):
 *   1. each warp scores keys of the tile (lanes split head_dim, warp sum);
 *      masked keys get -inf;
 *   2. the tile's maximum updates m; thread j < tile computes
 *      p_j = exp(s_j - m) into shared memory;
 *   3. every thread owns head_dim / ATTN_THREADS output dimensions and adds
 *      sum_j p_j V_j[d] to them; l += sum_j p_j (each thread sums the same
 *      shared p_j in the same order, so l is identical in every thread).
 * The CPU computes the same softmax in two passes; the two differ only by
 * float rounding (~1e-6 relative).
 *
 * That row kernel reads every visible K/V entry once per query row, which
 * is fine for decode (one row per sequence) but not for a prefill, where
 * all n_q rows of a sequence read the same keys. Sequences with several
 * query rows therefore go to a tiled kernel (FlashAttention-2 style, on
 * CUDA cores): one block per (tile of ATTN_TILE_Q rows of one sequence,
 * head); per step the block loads ATTN_TILE_K keys and values into shared
 * memory once, and each warp runs the online softmax for its 4 rows with a
 * lane per key (scores) and a lane per output dimension (accumulation).
 * The same visibility rule (causal by q_index, or the mask) applies per row.
 *
 * KV types: both kernels are instantiated per KV dtype (F32, F16, BF16,
 * Q8_0, Q4_0) and read the pages as stored, each element dequantized where
 * it is loaded (cu_kv_elem, the CPU's expressions). With rotation = R the
 * keys and values are H_R times the real ones, so the query is rotated once
 * into that domain (q.k = (Hq).(Hk)), the output accumulates there, and is
 * rotated back once at the end (H_R is its own inverse); the softmax itself
 * never sees the rotation.
 *
 * Sliding window (args->window = W > 0): a row with KV index i sees only
 * keys j > i - W. The scan starts at the first such key (the row kernel)
 * or the lowest over the tile's rows (the tiled kernel), so a windowed
 * decode step reads O(W) keys, not the whole context.
 *
 * Not done yet: splitting one long decode row over several blocks
 * (FlashDecoding), K/V read once per KV head for the whole GQA group, and
 * tensor cores for the tiled kernel (docs/cuda.md).
 *
 * Host arrays (page tables, q_index, masks) are staged into one region:
 *   seq_desc[n_seqs] | (seq, i)[rows] | tiles[n_tiles] | pages... |
 *   q_index... | masks...
 */
#include <math.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

#define ATTN_THREADS 128
#define ATTN_TILE 64
#define ATTN_MAX_DIMS_PER_THREAD 4 /* head_dim <= 512 */

/* tiled kernel: 4 warps x 4 query rows, 32 keys per step (a lane per key) */
#define ATTN_TILE_Q 16
#define ATTN_TILE_K 32
#define ATTN_TILE_ROWS_PER_WARP 4
#define ATTN_TILE_MAX_HD 128 /* shared memory: (16*hd + 32*(hd+1) + 32*hd) floats < 48 KB */
#define ATTN_TILE_MIN_ROWS 2 /* sequences with fewer query rows use the row kernel */

typedef struct {
    int q_start, n_q, n_kv;
    int has_mask;
    int64_t pages_off; /* int32 offset into the staged int32 area        */
    int64_t qidx_off;  /* int32 offset, -1 when absent (a mask, no window) */
    int64_t mask_off;  /* byte offset into the staged mask area, -1 none  */
} attn_seq_desc;

template <int KT>
static __global__ void attention_kernel(float *out, const float *q, const uint8_t *pool, int layer,
                                        int n_kv_head, int head_dim, int page_size,
                                        size_t head_bytes, int rotation, int window,
                                        size_t row_bytes, size_t page_bytes, int n_head,
                                        float scale, const attn_seq_desc *descs,
                                        const int32_t *row_info, const int32_t *ints,
                                        const uint8_t *masks)
{
    __shared__ float s_q[512];
    __shared__ float s_p[ATTN_TILE];

    const int row = blockIdx.x, h = blockIdx.y;
    /* (sequence, row within it) of this flattened query row */
    const attn_seq_desc sd = descs[row_info[2 * row]];
    const int i = row_info[2 * row + 1];
    const int group = n_head / n_kv_head;
    const int kvh = h / group;
    const size_t q_off = ((size_t)(sd.q_start + i) * n_head + h) * head_dim;
    const int32_t *pages = ints + sd.pages_off;
    const uint8_t *mask = sd.has_mask ? masks + sd.mask_off + (size_t)i * sd.n_kv : NULL;
    const int n_scan = mask ? sd.n_kv : ints[sd.qidx_off + i] + 1;
    /* first key inside the window: the scan starts there (O(window) reads) */
    int j_lo = 0;
    if (window > 0) {
        const int lo = ints[sd.qidx_off + i] - window + 1;
        j_lo = lo > 0 ? lo : 0;
    }
    const size_t head_off = (size_t)kvh * head_bytes;

    for (int d = threadIdx.x; d < head_dim; d += ATTN_THREADS)
        s_q[d] = q[q_off + d];
    __syncthreads();
    if (rotation > 0) /* into the keys' rotated domain */
        cu_fwht_runs<false>(s_q, head_dim, rotation, threadIdx.x, ATTN_THREADS);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float acc[ATTN_MAX_DIMS_PER_THREAD];
#pragma unroll
    for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++)
        acc[k] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    for (int j0 = j_lo; j0 < n_scan; j0 += ATTN_TILE) {
        const int tile = n_scan - j0 < ATTN_TILE ? n_scan - j0 : ATTN_TILE;
        /* 1. scores */
        for (int jj = warp; jj < tile; jj += ATTN_THREADS / 32) {
            const int j = j0 + jj;
            float s = -INFINITY;
            if (!mask || mask[j]) {
                const uint8_t *k =
                    pool + (size_t)pages[j / page_size] * page_bytes +
                    (((size_t)layer * 2) * page_size + (size_t)(j % page_size)) * row_bytes +
                    head_off;
                float dot = 0.0f;
                for (int d = lane; d < head_dim; d += 32) {
                    const float kd = cu_kv_elem<KT>(k, d);
                    dot += s_q[d] * kd;
                }
                for (int o = 16; o > 0; o >>= 1)
                    dot += __shfl_xor_sync(0xffffffffu, dot, o);
                s = dot * scale;
            }
            if (lane == 0)
                s_p[jj] = s;
        }
        __syncthreads();
        /* 2. new maximum (every thread scans the tile: same value everywhere) */
        float tile_max = -INFINITY;
        for (int jj = 0; jj < tile; jj++)
            tile_max = fmaxf(tile_max, s_p[jj]);
        const float m_new = fmaxf(m, tile_max);
        if (m_new == -INFINITY) {
            /* nothing visible yet: keep acc = 0, l = 0 */
            __syncthreads();
            continue;
        }
        const float correction = m == -INFINITY ? 0.0f : expf(m - m_new);
        __syncthreads(); /* all threads have read the scores */
        if (threadIdx.x < tile) {
            const float s = s_p[threadIdx.x];
            s_p[threadIdx.x] = s == -INFINITY ? 0.0f : expf(s - m_new);
        }
        __syncthreads();
        /* 3. accumulate V */
        float p_sum = 0.0f;
        for (int jj = 0; jj < tile; jj++)
            p_sum += s_p[jj];
        l = l * correction + p_sum;
        m = m_new;
#pragma unroll
        for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++) {
            const int d = threadIdx.x + k * ATTN_THREADS;
            if (d >= head_dim)
                break;
            float a = acc[k] * correction;
            for (int jj = 0; jj < tile; jj++) {
                const float p = s_p[jj];
                if (p == 0.0f)
                    continue; /* masked (or underflowed to nothing) */
                const int j = j0 + jj;
                const uint8_t *v =
                    pool + (size_t)pages[j / page_size] * page_bytes +
                    (((size_t)layer * 2 + 1) * page_size + (size_t)(j % page_size)) * row_bytes +
                    head_off;
                const float vd = cu_kv_elem<KT>(v, d);
                a += p * vd;
            }
            acc[k] = a;
        }
        __syncthreads(); /* s_p is rewritten by the next tile */
    }

    /* out may alias q: this block read its query row into shared memory
     * before any block wrote, and no other block reads this (row, head). */
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (rotation > 0) {
        /* back from the rotated domain, through s_q: its last readers (the
         * scores) are behind the loop's barriers */
#pragma unroll
        for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++) {
            const int d = threadIdx.x + k * ATTN_THREADS;
            if (d < head_dim)
                s_q[d] = acc[k] * inv;
        }
        __syncthreads();
        cu_fwht_runs<false>(s_q, head_dim, rotation, threadIdx.x, ATTN_THREADS);
        for (int d = threadIdx.x; d < head_dim; d += ATTN_THREADS)
            out[q_off + d] = s_q[d];
        return;
    }
#pragma unroll
    for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++) {
        const int d = threadIdx.x + k * ATTN_THREADS;
        if (d < head_dim)
            out[q_off + d] = acc[k] * inv;
    }
}

/* A tile: rows i0 .. i0+n-1 (n <= ATTN_TILE_Q) of sequence `seq`. */
typedef struct {
    int seq, i0, n;
} attn_qtile;

template <int KT>
static __global__ void attention_tile_kernel(float *out, const float *q, const uint8_t *pool,
                                             int layer, int n_kv_head, int head_dim, int page_size,
                                             size_t head_bytes, int rotation, int window,
                                             size_t row_bytes, size_t page_bytes,
                                             int n_head, float scale, const attn_seq_desc *descs,
                                             const attn_qtile *tiles, const int32_t *ints,
                                             const uint8_t *masks)
{
    extern __shared__ float smem[];
    const int hd = head_dim, kstride = hd + 1; /* odd stride: lanes hit distinct banks */
    float *sQ = smem;                          /* [ATTN_TILE_Q][hd]                    */
    float *sK = sQ + ATTN_TILE_Q * hd;         /* [ATTN_TILE_K][hd + 1]                */
    float *sV = sK + ATTN_TILE_K * kstride;    /* [ATTN_TILE_K][hd]                    */

    const attn_qtile tl = tiles[blockIdx.x];
    const attn_seq_desc sd = descs[tl.seq];
    const int h = blockIdx.y, kvh = h / (n_head / n_kv_head);
    const size_t head_off = (size_t)kvh * head_bytes;
    const int32_t *pages = ints + sd.pages_off;
    const int32_t *qidx = sd.qidx_off >= 0 ? ints + sd.qidx_off : NULL;
    const uint8_t *mask = sd.has_mask ? masks + sd.mask_off : NULL;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    for (int idx = threadIdx.x; idx < ATTN_TILE_Q * hd; idx += blockDim.x) {
        const int r = idx / hd, d = idx % hd;
        sQ[idx] = r < tl.n ? q[((size_t)(sd.q_start + tl.i0 + r) * n_head + h) * hd + d] : 0.0f;
    }
    if (rotation > 0) { /* the rows into the keys' rotated domain */
        __syncthreads();
        cu_fwht_runs<false>(sQ, ATTN_TILE_Q * hd, rotation, threadIdx.x, blockDim.x);
    }
    /* keys any row of the tile may see, [scan_min, scan_max) (the same
     * values in every thread); with a window, keys below every row's
     * window are never loaded */
    int scan_max = 0, scan_min = INT32_MAX;
    for (int r = 0; r < tl.n; r++) {
        const int n_scan = mask ? sd.n_kv : qidx[tl.i0 + r] + 1;
        scan_max = n_scan > scan_max ? n_scan : scan_max;
        const int lo = window > 0 ? qidx[tl.i0 + r] - window + 1 : 0;
        scan_min = lo < scan_min ? lo : scan_min;
    }
    scan_min = scan_min > 0 ? scan_min : 0;

    float m[ATTN_TILE_ROWS_PER_WARP], l[ATTN_TILE_ROWS_PER_WARP];
    float acc[ATTN_TILE_ROWS_PER_WARP][ATTN_TILE_MAX_HD / 32];
#pragma unroll
    for (int k = 0; k < ATTN_TILE_ROWS_PER_WARP; k++) {
        m[k] = -INFINITY;
        l[k] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < ATTN_TILE_MAX_HD / 32; kk++)
            acc[k][kk] = 0.0f;
    }

    for (int j0 = scan_min; j0 < scan_max; j0 += ATTN_TILE_K) {
        const int tile = scan_max - j0 < ATTN_TILE_K ? scan_max - j0 : ATTN_TILE_K;
        __syncthreads(); /* the previous step's readers of sK/sV (and sQ's writers) are done */
        for (int idx = threadIdx.x; idx < tile * hd; idx += blockDim.x) {
            const int jj = idx / hd, d = idx % hd, j = j0 + jj;
            const uint8_t *k =
                pool + (size_t)pages[j / page_size] * page_bytes +
                ((size_t)layer * 2 * page_size + (size_t)(j % page_size)) * row_bytes + head_off;
            const uint8_t *v = k + (size_t)page_size * row_bytes; /* V follows K in the layer */
            sK[jj * kstride + d] = cu_kv_elem<KT>(k, d);
            sV[jj * hd + d] = cu_kv_elem<KT>(v, d);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < ATTN_TILE_ROWS_PER_WARP; k++) {
            const int r = warp * ATTN_TILE_ROWS_PER_WARP + k;
            if (r >= tl.n)
                continue; /* uniform over the warp */
            const int i = tl.i0 + r;
            const int j = j0 + lane;
            const int n_scan = mask ? sd.n_kv : qidx[i] + 1;
            const int j_lo = window > 0 ? qidx[i] - window + 1 : 0;
            const bool visible = lane < tile && j >= j_lo && j < n_scan &&
                                 (!mask || mask[(size_t)i * sd.n_kv + j]);
            float s = -INFINITY;
            if (visible) {
                float dot = 0.0f;
                for (int d = 0; d < hd; d++)
                    dot += sQ[r * hd + d] * sK[lane * kstride + d];
                s = dot * scale;
            }
            float tmax = s;
            for (int o = 16; o > 0; o >>= 1)
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
            const float m_new = fmaxf(m[k], tmax);
            if (m_new == -INFINITY)
                continue; /* nothing visible yet; uniform over the warp */
            const float corr = m[k] == -INFINITY ? 0.0f : expf(m[k] - m_new);
            const float p = visible ? expf(s - m_new) : 0.0f;
            float psum = p;
            for (int o = 16; o > 0; o >>= 1)
                psum += __shfl_xor_sync(0xffffffffu, psum, o);
            l[k] = l[k] * corr + psum;
            m[k] = m_new;
#pragma unroll
            for (int kk = 0; kk < ATTN_TILE_MAX_HD / 32; kk++)
                acc[k][kk] *= corr;
            for (int jj = 0; jj < tile; jj++) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
                if (pj == 0.0f)
                    continue; /* masked: uniform over the warp */
#pragma unroll
                for (int kk = 0; kk < ATTN_TILE_MAX_HD / 32; kk++) {
                    const int d = lane + 32 * kk;
                    if (d < hd)
                        acc[k][kk] += pj * sV[jj * hd + d];
                }
            }
        }
    }

    /* out may alias q: every block read its own rows of q (and only those)
     * into sQ before the loop, and writes only those rows here. */
    if (rotation > 0) {
        /* back from the rotated domain through this warp's own rows of sQ
         * (no other warp reads them), so a warp barrier is enough */
        float *sw = sQ + (size_t)warp * ATTN_TILE_ROWS_PER_WARP * hd;
        __syncwarp();
#pragma unroll
        for (int k = 0; k < ATTN_TILE_ROWS_PER_WARP; k++) {
            const int r = warp * ATTN_TILE_ROWS_PER_WARP + k;
            const float inv = r < tl.n && l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
#pragma unroll
            for (int kk = 0; kk < ATTN_TILE_MAX_HD / 32; kk++) {
                const int d = lane + 32 * kk;
                if (d < hd)
                    sw[k * hd + d] = acc[k][kk] * inv;
            }
        }
        __syncwarp();
        cu_fwht_runs<true>(sw, ATTN_TILE_ROWS_PER_WARP * hd, rotation, lane, 32);
        for (int k = 0; k < ATTN_TILE_ROWS_PER_WARP; k++) {
            const int r = warp * ATTN_TILE_ROWS_PER_WARP + k;
            if (r >= tl.n)
                continue;
            float *o = out + ((size_t)(sd.q_start + tl.i0 + r) * n_head + h) * hd;
            for (int d = lane; d < hd; d += 32)
                o[d] = sw[k * hd + d];
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < ATTN_TILE_ROWS_PER_WARP; k++) {
        const int r = warp * ATTN_TILE_ROWS_PER_WARP + k;
        if (r >= tl.n)
            continue;
        const float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
        float *o = out + ((size_t)(sd.q_start + tl.i0 + r) * n_head + h) * hd;
#pragma unroll
        for (int kk = 0; kk < ATTN_TILE_MAX_HD / 32; kk++) {
            const int d = lane + 32 * kk;
            if (d < hd)
                o[d] = acc[k][kk] * inv;
        }
    }
}

int cuda_attention(cairn_backend *be, const cairn_attn_args *a)
{
    if (!be || cairn_attn_args_check(a, NULL) != CAIRN_OK)
        return CAIRN_EINVAL;
    const cairn_kv_layout *L = a->kv;
    const size_t head_bytes = cairn_kv_head_bytes(L->dtype, L->head_dim);
    if (head_bytes == 0)
        return CAIRN_EINVAL;
    if (L->head_dim > ATTN_THREADS * ATTN_MAX_DIMS_PER_THREAD) {
        cairn_log(CAIRN_LOG_ERROR, "cuda attention: head_dim %d is above the supported %d",
                  L->head_dim, ATTN_THREADS * ATTN_MAX_DIMS_PER_THREAD);
        return CAIRN_EUNSUPPORTED;
    }
    /* Sizes of the staged pieces. Sequences with several query rows go to
     * the tiled kernel (when the head fits its shared memory), the others
     * row by row. */
    const int tiled_hd = L->head_dim <= ATTN_TILE_MAX_HD;
    int64_t n_rows = 0, n_tiles = 0, n_ints = 0, n_mask_bytes = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        const cairn_attn_seq *seq = &a->seqs[s];
        if (tiled_hd && seq->n_q >= ATTN_TILE_MIN_ROWS)
            n_tiles += (seq->n_q + ATTN_TILE_Q - 1) / ATTN_TILE_Q;
        else
            n_rows += seq->n_q;
        n_ints += (seq->n_kv + L->page_size - 1) / L->page_size;
        if (seq->mask)
            n_mask_bytes += (int64_t)seq->n_q * seq->n_kv;
        if (!seq->mask || a->window > 0) /* the window needs every row's index */
            n_ints += seq->n_q;
    }
    if (n_rows > INT32_MAX || n_tiles > INT32_MAX)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);

    const size_t desc_bytes = ((size_t)a->n_seqs * sizeof(attn_seq_desc) + 15) / 16 * 16;
    const size_t rows_bytes = ((size_t)n_rows * 2 * sizeof(int32_t) + 15) / 16 * 16;
    const size_t tiles_bytes = ((size_t)n_tiles * sizeof(attn_qtile) + 15) / 16 * 16;
    const size_t ints_bytes = ((size_t)n_ints * sizeof(int32_t) + 15) / 16 * 16;
    const size_t off_rows = desc_bytes, off_tiles = off_rows + rows_bytes;
    const size_t off_ints = off_tiles + tiles_bytes, off_masks = off_ints + ints_bytes;
    const size_t total = off_masks + (size_t)n_mask_bytes;
    uint8_t *host, *dev;
    if ((rc = cuda_stage_reserve(ctx, total, &host, &dev)) != CAIRN_OK)
        return rc;
    attn_seq_desc *descs = (attn_seq_desc *)host;
    int32_t *row_info = (int32_t *)(host + off_rows);
    attn_qtile *tiles = (attn_qtile *)(host + off_tiles);
    int32_t *ints = (int32_t *)(host + off_ints);
    uint8_t *masks = host + off_masks;
    int64_t row = 0, tile = 0, io = 0, mo = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        const cairn_attn_seq *seq = &a->seqs[s];
        attn_seq_desc *d = &descs[s];
        d->q_start = seq->q_start;
        d->n_q = seq->n_q;
        d->n_kv = seq->n_kv;
        const int n_pages = (seq->n_kv + L->page_size - 1) / L->page_size;
        d->pages_off = io;
        memcpy(ints + io, seq->pages, (size_t)n_pages * sizeof(int32_t));
        io += n_pages;
        if (seq->mask) {
            d->has_mask = 1;
            d->qidx_off = -1;
            d->mask_off = mo;
            memcpy(masks + mo, seq->mask, (size_t)seq->n_q * seq->n_kv);
            mo += (int64_t)seq->n_q * seq->n_kv;
            if (a->window > 0) {
                d->qidx_off = io;
                memcpy(ints + io, seq->q_index, (size_t)seq->n_q * sizeof(int32_t));
                io += seq->n_q;
            }
        } else {
            d->has_mask = 0;
            d->mask_off = -1;
            d->qidx_off = io;
            memcpy(ints + io, seq->q_index, (size_t)seq->n_q * sizeof(int32_t));
            io += seq->n_q;
        }
        if (tiled_hd && seq->n_q >= ATTN_TILE_MIN_ROWS) {
            for (int i0 = 0; i0 < seq->n_q; i0 += ATTN_TILE_Q, tile++) {
                tiles[tile].seq = s;
                tiles[tile].i0 = i0;
                tiles[tile].n = seq->n_q - i0 < ATTN_TILE_Q ? seq->n_q - i0 : ATTN_TILE_Q;
            }
        } else {
            for (int i = 0; i < seq->n_q; i++, row++) {
                row_info[2 * row] = s;
                row_info[2 * row + 1] = i;
            }
        }
    }
    /* every layer of a step stages the same tables: sent once per step */
    if ((rc = cuda_stage_commit(ctx, host, &dev, total)) != CAIRN_OK)
        return rc;

    const uint8_t *pool = (const uint8_t *)a->kv_pool + L->layer_base;
    const int R = L->rotation, W = a->window;
    if (n_rows > 0) {
        dim3 grid((unsigned)n_rows, (unsigned)a->n_head);
#define ATTN_ROW_LAUNCH(KT)                                                                        \
    attention_kernel<KT><<<grid, ATTN_THREADS, 0, ctx->stream>>>(                                  \
        a->out, a->q, pool, a->layer, L->n_kv_head, L->head_dim, L->page_size, head_bytes, R, W,   \
        L->row_bytes, L->page_bytes, a->n_head, a->scale, (const attn_seq_desc *)dev,             \
        (const int32_t *)(dev + off_rows), (const int32_t *)(dev + off_ints), dev + off_masks)
        CUDA_KV_TYPE_DISPATCH(L->dtype, ATTN_ROW_LAUNCH)
#undef ATTN_ROW_LAUNCH
        CUDA_LAUNCHED("attention");
    }
    if (n_tiles > 0) {
        const int hd = L->head_dim;
        const size_t smem =
            (size_t)(ATTN_TILE_Q * hd + ATTN_TILE_K * (hd + 1) + ATTN_TILE_K * hd) * sizeof(float);
        dim3 grid((unsigned)n_tiles, (unsigned)a->n_head);
        const unsigned threads = 32 * ATTN_TILE_Q / ATTN_TILE_ROWS_PER_WARP;
#define ATTN_TILE_LAUNCH(KT)                                                                       \
    attention_tile_kernel<KT><<<grid, threads, smem, ctx->stream>>>(                               \
        a->out, a->q, pool, a->layer, L->n_kv_head, hd, L->page_size, head_bytes, R, W,            \
        L->row_bytes, L->page_bytes, a->n_head, a->scale, (const attn_seq_desc *)dev,             \
        (const attn_qtile *)(dev + off_tiles), (const int32_t *)(dev + off_ints), dev + off_masks)
        CUDA_KV_TYPE_DISPATCH(L->dtype, ATTN_TILE_LAUNCH)
#undef ATTN_TILE_LAUNCH
        CUDA_LAUNCHED("attention_tile");
    }
    return CAIRN_OK;
}
