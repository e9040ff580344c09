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
 * Split-KV decode (FlashDecoding). The row kernel puts one block on a
 * (row, head): at batch 1 an 8B model (32 heads) fills 32 of 132 SMs, and
 * each block walks the whole context alone. A decode row (one query row,
 * no mask) with more than ATTN_SPLIT_MIN_KEYS = 1024 visible keys is
 * instead cut into chunks of ATTN_SPLIT_CHUNK = 256 keys:
 *   pass 1, one block per (row, chunk, KV head, slice of <= 8 query heads
 *     of its GQA group): the online softmax above over the chunk for all
 *     heads of the slice at once (each K/V element loaded once per slice,
 *     not once per query head), writing (m, l, unnormalized acc[head_dim])
 *     per (row, head, chunk) to scratch;
 *   pass 2, one block per (row, head): M = max m_c, then in chunk order
 *     0, 1, 2, ...: L += exp(m_c - M) l_c, acc += exp(m_c - M) acc_c;
 *     out = acc / L, rotated back.
 * Chunk size, from bytes per block: a 256-key chunk of an F16 head_dim 128
 * head is 256 x 2 x 256 B = 128 KiB of K+V; its partials are 4 heads x 130
 * floats = 2 KiB written and read again, ~3% on top. At the H200's 4.8
 * TB/s over 132 SMs (36 B/ns an SM) the chunk is ~3.6 us of an SM's share
 * of HBM, well above a block's start-up; and 4k keys x 8 KV heads already
 * give 128 blocks (one wave), 16k keys 512. 128-key chunks would give a
 * 4k row two blocks an SM at batch 1 but double the partial traffic and
 * the combine's loop for every length; 512 would leave three quarters of
 * the SMs idle at 4k (bench/gpu/NOTES.md: measure 128/256/512). Threshold: at <= 1024 keys a layer's whole K+V
 * (1024 x 8 x 512 B = 4 MiB for the 8B model) is ~1 us of HBM, about the
 * cost of the second launch, so short rows keep the single-pass kernel.
 * Scratch: the backend's device scratch (cuda_scratch_reserve, grown only
 * when too small, never freed per call), at most ATTN_SPLIT_SCRATCH_MAX =
 * 64 MiB per launch group; more split rows than that run as several groups
 * one after the other in the same scratch.
 *
 * Batch rule: a row's output depends only on its own sequence (its
 * context, q_index, the window) and the shape, never on the batch, the
 * number of rows in the call, or which other sequences are present. So
 * which kernel a row takes and its chunking are a pure function of its
 * visible key count and (n_head, head_dim) (attn_split_count), never of
 * the batch size or the SM count; how rows are grouped into launches and
 * where their partials lie changes no value. Same row alone or in a batch:
 * same bits. The one exception: if the scratch cannot be allocated (out
 * of device memory) the long rows fall back to the row kernel, logged.
 * CAIRN_CUDA_SPLIT_ATTN=0 (process-wide, read once) turns the path off,
 * for measuring one kernel against the other.
 * Prefills and rows whose partials alone would pass the scratch bound
 * (~1M keys at 32 heads of 128) stay on the other kernels.
 *
 * Verification rows (a sequence with a mask: a speculative tree or chain)
 * must give the bits the same token gets as a plain decode row, or
 * speculation would not be lossless at near-ties. A decode row's sums
 * depend on how its visible keys fall into tiles and chunks, counted from
 * its first visible key; a tree row's visible keys are its prefix and its
 * ancestors, which sit at tree slots, not at the consecutive indices the
 * accepted tokens would have had. So a masked row is staged as the list of
 * its visible keys in index order (the leading run [j_lo, j_lo + n_run) as
 * two numbers, the keys after it listed) and goes to the row kernel or the
 * split path by its visible count, exactly as a decode row, which walks
 * the same positions 0, 1, 2, ... of that list: the same tiles, chunks and
 * order of additions, hence the same bits (tests/gpu/test_gpu_ops.c,
 * test_attention_verify_rows). The tiled kernel keeps the prefills.
 *
 * Attention sinks (args->sinks, gpt-oss): a logit per query head that joins
 * every row's softmax denominator and adds no value,
 *   out = sum_j e^{s_j} V_j / (e^{sink_h} + sum_j e^{s_j}).
 * The kernels' online softmax is left as it is; only the final division
 * changes (attn_inv_denom), in the row kernel, the combine of the split
 * path and the tiled kernel, so the sink-free path keeps its instructions
 * but for one uniform branch on a NULL pointer per output.
 *
 * Not done yet: tensor cores for the tiled kernel, and the split path's
 * K/V loads are per element (cu_kv_elem), not vectorized (docs/cuda.md,
 * bench/gpu/NOTES.md).
 *
 * Host arrays (page tables, q_index, listed keys) are staged into one
 * region:
 *   seq_desc[n_seqs] | row_info[rows] | tiles[n_tiles] |
 *   split_row[n_split] | (split row, chunk)[n_chunks] | pages... |
 *   q_index... and listed keys...
 */
#include <math.h>
#include <stdlib.h>
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

/* split-KV decode (see the header comment for the arithmetic) */
#define ATTN_SPLIT_CHUNK 256     /* keys per block of pass 1                          */
#define ATTN_SPLIT_MIN_KEYS 1024 /* a row with more visible keys than this is split    */
#define ATTN_SPLIT_G 8           /* query heads of a GQA group per block (a slice)     */
#define ATTN_SPLIT_TILE 64       /* keys scored per step inside a chunk                */
/* Partials of one launch group at most; a row that alone needs more (over
 * ~1M keys at 32 heads of 128) stays on the row kernel. */
#define ATTN_SPLIT_SCRATCH_MAX ((size_t)64 << 20)
static_assert(ATTN_SPLIT_TILE <= ATTN_THREADS, "a thread per key of a tile resolves its offset");
static_assert(ATTN_SPLIT_G <= ATTN_THREADS, "a thread per head keeps m and l");

/* A row of the row kernel: (sequence, row within it), then for a listed
 * (masked) row its visible keys as positions 0 .. n_vis - 1: the run
 * j_lo .. j_lo + n_run - 1, then n_vis - n_run keys listed at tail_off in
 * the staged ints (-1: none); j_lo = -1 for an unlisted row (its keys come
 * from its q_index and the window). */
#define ATTN_ROW_INFO 6

/* The key at position p of a listed row. */
static __device__ __forceinline__ int listed_key(int p, int j_lo, int n_run, const int32_t *tail)
{
    return p < n_run ? j_lo + p : tail[p - n_run];
}

/* The factor a row's unnormalized accumulator is multiplied by at the end,
 * from its online softmax's running maximum m and sum l (l = sum_j e^{s_j - m}):
 * 1 / l, or with a sink (sinks: [n_head] F32, NULL for none) for head h
 *   e^{m - M} / (l e^{m - M} + e^{sink - M}),  M = max(m, sink),
 * i.e. 1 / (l + e^{sink - m}) written so that neither exponential overflows
 * whichever of m and the sink is larger. A row that saw nothing (l = 0,
 * m = -inf) gives 0: zeros out, with or without a sink. */
static __device__ __forceinline__ float attn_inv_denom(float m, float l, const float *sinks, int h)
{
    if (!(l > 0.0f))
        return 0.0f;
    if (!sinks)
        return 1.0f / l;
    const float sink = sinks[h];
    const float M = fmaxf(m, sink);
    const float w = expf(m - M);
    return w / (l * w + expf(sink - M));
}

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
                                        const uint8_t *masks, const float *sinks)
{
    __shared__ float s_q[512];
    __shared__ float s_p[ATTN_TILE];

    const int row = blockIdx.x, h = blockIdx.y;
    /* (sequence, row within it) of this flattened query row */
    const int32_t *ri = row_info + (size_t)ATTN_ROW_INFO * row;
    const attn_seq_desc sd = descs[ri[0]];
    const int i = ri[1];
    const int group = n_head / n_kv_head;
    const int kvh = h / group;
    const size_t q_off = ((size_t)(sd.q_start + i) * n_head + h) * head_dim;
    const int32_t *pages = ints + sd.pages_off;
    /* a listed row scans positions 0 .. n_vis - 1 of its visible keys
     * (listed_key); an unlisted one the keys j_lo .. n_scan - 1 themselves */
    const int listed = ri[2] >= 0;
    const int run_lo = ri[2], n_run = ri[3];
    const int32_t *tail = listed && ri[5] >= 0 ? ints + ri[5] : NULL;
    const uint8_t *mask =
        !listed && sd.has_mask ? masks + sd.mask_off + (size_t)i * sd.n_kv : NULL;
    const int n_scan = listed ? ri[4] : mask ? sd.n_kv : ints[sd.qidx_off + i] + 1;
    /* first key inside the window: the scan starts there (O(window) reads) */
    int j_lo = 0;
    if (window > 0 && !listed) {
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
            const int j = listed ? listed_key(j0 + jj, run_lo, n_run, tail) : j0 + jj;
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
                const int j = listed ? listed_key(j0 + jj, run_lo, n_run, tail) : j0 + jj;
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
    const float inv = attn_inv_denom(m, l, sinks, h);
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

/* ---- split-KV decode (FlashDecoding) -------------------------------------- */

/* A row taken by the split path: its n_vis visible keys, as positions
 * 0 .. n_vis - 1 (the run j_lo .. j_lo + n_run - 1, then the keys listed
 * at tail_off; a decode row is all run), in n_chunks chunks of
 * ATTN_SPLIT_CHUNK positions; its partials are records
 * part_base .. part_base + n_chunks - 1 (per head) of its launch group. */
typedef struct {
    int q_row;   /* row of q / out                                   */
    int j_lo;    /* first visible key (the window's), 0 without      */
    int n_run;   /* visible keys j_lo .. j_lo + n_run - 1            */
    int n_vis;   /* n_run + the listed keys                          */
    int n_chunks;
    int64_t pages_off; /* int32 offset into the staged int32 area     */
    int64_t tail_off;  /* int32 offset of the listed keys, -1: none   */
    int64_t part_base; /* chunk records before this row's, in its group */
} attn_split_row;

/* Pass 1. One block per (chunk c of split row r, KV head kvh, slice of up
 * to ATTN_SPLIT_G of its query heads): blockIdx.x indexes the (r, c) table
 * `chunks`, blockIdx.y = kvh * n_slices + slice. The block scores every key
 * of the chunk against all gn query heads of the slice at once, so each K
 * and V element is loaded once for the slice, not once per query head:
 *   0. thread jj < tile resolves key jj's page and byte offset into shared
 *      memory (one divide and page-table load per key, not per element);
 *   1. each warp takes a key (lanes split head_dim), loads K[d] once and
 *      adds it into gn dot products; a warp sum each;
 *   2. thread g < gn: tile maximum of head g, new m_g, correction
 *      exp(m_old - m_new) (0 while nothing was seen);
 *   3. every thread turns its share of the gn x tile scores into p;
 *   4. thread g < gn: l_g = l_g * corr_g + sum_j p_gj in key order; every
 *      thread owns head_dim / ATTN_THREADS dimensions d for all gn heads,
 *      loads V[d] once per key and adds p_gj V[d] to each head's acc.
 * It writes, per head, the record (m, l, acc[head_dim]) — acc not divided
 * by l, in the rotated domain when there is a rotation — to
 *   part[((part_base + c) * n_head + h) * (head_dim + 2)].
 * Every key of a chunk is visible (plain causal rows only), so each chunk
 * has a finite m unless a score itself overflows. */
template <int KT>
static __global__ void attention_split_kernel(float *part, const float *q, const uint8_t *pool,
                                              int layer, int head_dim, int page_size,
                                              size_t head_bytes, int rotation, size_t row_bytes,
                                              size_t page_bytes, int n_head, int group,
                                              int n_slices, float scale,
                                              const attn_split_row *srows, const int32_t *chunks,
                                              const int32_t *ints)
{
    __shared__ float s_q[ATTN_SPLIT_G * 512];
    __shared__ float s_p[ATTN_SPLIT_G][ATTN_SPLIT_TILE];
    __shared__ float s_m[ATTN_SPLIT_G], s_l[ATTN_SPLIT_G], s_corr[ATTN_SPLIT_G];
    __shared__ size_t s_koff[ATTN_SPLIT_TILE]; /* byte offset of each key's K head */

    const attn_split_row sr = srows[chunks[2 * blockIdx.x]];
    const int c = chunks[2 * blockIdx.x + 1];
    const int kvh = blockIdx.y / n_slices, slice = blockIdx.y % n_slices;
    const int h0 = kvh * group + slice * ATTN_SPLIT_G;
    const int gn = group - slice * ATTN_SPLIT_G < ATTN_SPLIT_G ? group - slice * ATTN_SPLIT_G
                                                               : ATTN_SPLIT_G;
    const int hd = head_dim;
    /* positions of the row's visible keys (listed_key), not key indices */
    const int j_begin = c * ATTN_SPLIT_CHUNK;
    const int j_end = sr.n_vis - j_begin < ATTN_SPLIT_CHUNK ? sr.n_vis : j_begin + ATTN_SPLIT_CHUNK;
    const int32_t *tail = sr.tail_off >= 0 ? ints + sr.tail_off : NULL;
    const int32_t *pages = ints + sr.pages_off;
    const size_t head_off = (size_t)kvh * head_bytes;
    const size_t v_off = (size_t)page_size * row_bytes; /* V follows K in the layer */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    /* the slice's query heads h0 .. h0 + gn - 1 are consecutive in q */
    const float *qr = q + ((size_t)sr.q_row * n_head + h0) * hd;
    for (int idx = threadIdx.x; idx < gn * hd; idx += ATTN_THREADS)
        s_q[idx] = qr[idx];
    if (threadIdx.x < ATTN_SPLIT_G) {
        s_m[threadIdx.x] = -INFINITY;
        s_l[threadIdx.x] = 0.0f;
    }
    __syncthreads();
    if (rotation > 0) /* runs of R divide head_dim: no run straddles two heads */
        cu_fwht_runs<false>(s_q, gn * hd, rotation, threadIdx.x, ATTN_THREADS);

    float acc[ATTN_MAX_DIMS_PER_THREAD][ATTN_SPLIT_G];
#pragma unroll
    for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++)
#pragma unroll
        for (int g = 0; g < ATTN_SPLIT_G; g++)
            acc[k][g] = 0.0f;

    for (int j0 = j_begin; j0 < j_end; j0 += ATTN_SPLIT_TILE) {
        const int tile = j_end - j0 < ATTN_SPLIT_TILE ? j_end - j0 : ATTN_SPLIT_TILE;
        /* 0. each key's page id and offset once (no divide or dependent
         * page-table load per element below); V is page_size rows on */
        if (threadIdx.x < tile) {
            const int j = listed_key(j0 + threadIdx.x, sr.j_lo, sr.n_run, tail);
            s_koff[threadIdx.x] =
                (size_t)pages[j / page_size] * page_bytes +
                (((size_t)layer * 2) * page_size + (size_t)(j % page_size)) * row_bytes + head_off;
        }
        __syncthreads();
        /* 1. scores of the tile's keys for the gn heads (unrolled so that two
         * keys' loads are in flight per warp, not one) */
#pragma unroll 2
        for (int jj = warp; jj < tile; jj += ATTN_THREADS / 32) {
            const uint8_t *k = pool + s_koff[jj];
            float dot[ATTN_SPLIT_G];
#pragma unroll
            for (int g = 0; g < ATTN_SPLIT_G; g++)
                dot[g] = 0.0f;
#pragma unroll 4
            for (int d = lane; d < hd; d += 32) {
                const float kd = cu_kv_elem<KT>(k, d);
#pragma unroll
                for (int g = 0; g < ATTN_SPLIT_G; g++)
                    if (g < gn)
                        dot[g] += s_q[g * hd + d] * kd;
            }
#pragma unroll
            for (int g = 0; g < ATTN_SPLIT_G; g++) {
                if (g >= gn)
                    break; /* uniform over the block */
                float s = dot[g];
                for (int o = 16; o > 0; o >>= 1)
                    s += __shfl_xor_sync(0xffffffffu, s, o);
                if (lane == 0)
                    s_p[g][jj] = s * scale;
            }
        }
        __syncthreads();
        /* 2. per head: new maximum and the correction of what came before */
        if (threadIdx.x < gn) {
            const int g = threadIdx.x;
            float tmax = -INFINITY;
            for (int jj = 0; jj < tile; jj++)
                tmax = fmaxf(tmax, s_p[g][jj]);
            const float m_old = s_m[g], m_new = fmaxf(m_old, tmax);
            s_corr[g] = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            s_m[g] = m_new;
        }
        __syncthreads();
        /* 3. p = exp(s - m) (0 for a -inf score, also while m is -inf) */
        for (int idx = threadIdx.x; idx < gn * ATTN_SPLIT_TILE; idx += ATTN_THREADS) {
            const int g = idx / ATTN_SPLIT_TILE, jj = idx % ATTN_SPLIT_TILE;
            if (jj < tile) {
                const float s = s_p[g][jj];
                s_p[g][jj] = s == -INFINITY ? 0.0f : expf(s - s_m[g]);
            }
        }
        __syncthreads();
        /* 4. l in key order (one thread a head), and p V into acc */
        if (threadIdx.x < gn) {
            const int g = threadIdx.x;
            float p_sum = 0.0f;
            for (int jj = 0; jj < tile; jj++)
                p_sum += s_p[g][jj];
            s_l[g] = s_l[g] * s_corr[g] + p_sum;
        }
        float corr[ATTN_SPLIT_G];
#pragma unroll
        for (int g = 0; g < ATTN_SPLIT_G; g++)
            corr[g] = g < gn ? s_corr[g] : 0.0f;
#pragma unroll
        for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++) {
            const int d = threadIdx.x + k * ATTN_THREADS;
            if (d >= hd)
                break;
#pragma unroll
            for (int g = 0; g < ATTN_SPLIT_G; g++)
                acc[k][g] *= corr[g];
            /* no branch on p (every key of a chunk is visible): unrolled,
             * eight keys' V loads are in flight per thread */
#pragma unroll 8
            for (int jj = 0; jj < tile; jj++) {
                const uint8_t *v = pool + s_koff[jj] + v_off;
                const float vd = cu_kv_elem<KT>(v, d);
#pragma unroll
                for (int g = 0; g < ATTN_SPLIT_G; g++)
                    if (g < gn)
                        acc[k][g] += s_p[g][jj] * vd;
            }
        }
        __syncthreads(); /* s_p, s_corr, s_koff are rewritten by the next tile */
    }

    /* s_m[g] and s_l[g] were last written by thread g itself */
    const size_t rec = (size_t)hd + 2;
    float *base = part + ((size_t)(sr.part_base + c) * n_head + h0) * rec;
    if (threadIdx.x < gn) {
        base[(size_t)threadIdx.x * rec] = s_m[threadIdx.x];
        base[(size_t)threadIdx.x * rec + 1] = s_l[threadIdx.x];
    }
#pragma unroll
    for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++) {
        const int d = threadIdx.x + k * ATTN_THREADS;
        if (d >= hd)
            break;
#pragma unroll
        for (int g = 0; g < ATTN_SPLIT_G; g++)
            if (g < gn)
                base[(size_t)g * rec + 2 + d] = acc[k][g];
    }
}

/* Pass 2. One block per (split row, query head): the chunks' records merged
 * in chunk order 0, 1, 2, ...:
 *   M = max_c m_c (a block reduction; max is exact, so any order gives the
 *       same value), w_c = exp(m_c - M),
 *   L = sum_c w_c l_c,  out[d] = (sum_c w_c acc_c[d]) / L (with a sink, the
 *       denominator of attn_inv_denom over (M, L)),
 * each thread summing in that order for its own d (and computing the same
 * L as every other thread). Rotated back through shared memory at the end.
 * out may alias q: pass 1 (earlier on the stream) read this row's q. */
static __global__ void attention_combine_kernel(float *out, const float *part, int head_dim,
                                                int n_head, int rotation,
                                                const attn_split_row *srows, const float *sinks)
{
    __shared__ float s_o[512];
    __shared__ float s_wmax[ATTN_THREADS / 32];
    const attn_split_row sr = srows[blockIdx.x];
    const int h = blockIdx.y, hd = head_dim;
    const size_t rec = (size_t)hd + 2, stride = (size_t)n_head * rec;
    const float *r0 = part + ((size_t)sr.part_base * n_head + h) * rec;

    float M = -INFINITY;
    for (int c = threadIdx.x; c < sr.n_chunks; c += ATTN_THREADS)
        M = fmaxf(M, r0[(size_t)c * stride]);
    for (int o = 16; o > 0; o >>= 1)
        M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (threadIdx.x % 32 == 0)
        s_wmax[threadIdx.x / 32] = M;
    __syncthreads();
    M = s_wmax[0];
    for (int w = 1; w < ATTN_THREADS / 32; w++)
        M = fmaxf(M, s_wmax[w]);

    float a[ATTN_MAX_DIMS_PER_THREAD];
#pragma unroll
    for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++)
        a[k] = 0.0f;
    float L = 0.0f;
    /* unrolled: eight chunks' loads in flight (the records were just
     * written, so mostly L2 hits); the sums still run in chunk order */
#pragma unroll 8
    for (int c = 0; c < sr.n_chunks; c++) {
        const float *r = r0 + (size_t)c * stride;
        const float mc = r[0];
        const float w = mc == -INFINITY ? 0.0f : expf(mc - M);
        L += w * r[1];
#pragma unroll
        for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++) {
            const int d = threadIdx.x + k * ATTN_THREADS;
            if (d < hd)
                a[k] += w * r[2 + d];
        }
    }
    /* the row's maximum and sum over all its keys are M and L: the sink
     * joins here, once, not in pass 1's per-chunk records */
    const float inv = attn_inv_denom(M, L, sinks, h);
    float *o = out + ((size_t)sr.q_row * n_head + h) * hd;
    if (rotation > 0) {
#pragma unroll
        for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++) {
            const int d = threadIdx.x + k * ATTN_THREADS;
            if (d < hd)
                s_o[d] = a[k] * inv;
        }
        __syncthreads();
        cu_fwht_runs<false>(s_o, hd, rotation, threadIdx.x, ATTN_THREADS);
        for (int d = threadIdx.x; d < hd; d += ATTN_THREADS)
            o[d] = s_o[d];
        return;
    }
#pragma unroll
    for (int k = 0; k < ATTN_MAX_DIMS_PER_THREAD; k++) {
        const int d = threadIdx.x + k * ATTN_THREADS;
        if (d < hd)
            o[d] = a[k] * inv;
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
                                             const uint8_t *masks, const float *sinks)
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
            const float inv = r < tl.n ? attn_inv_denom(m[k], l[k], sinks, h) : 0.0f;
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
        const float inv = attn_inv_denom(m[k], l[k], sinks, h);
        float *o = out + ((size_t)(sd.q_start + tl.i0 + r) * n_head + h) * hd;
#pragma unroll
        for (int kk = 0; kk < ATTN_TILE_MAX_HD / 32; kk++) {
            const int d = lane + 32 * kk;
            if (d < hd)
                o[d] = acc[k][kk] * inv;
        }
    }
}

/* Bytes of the partials of a split row of n_chunks chunks. */
static size_t attn_split_bytes(int n_chunks, int n_head, int head_dim)
{
    return (size_t)n_chunks * (size_t)n_head * ((size_t)head_dim + 2) * sizeof(float);
}

/* CAIRN_CUDA_SPLIT_ATTN=0 in the environment turns the split path off (every
 * decode row on the row kernel), for measuring one against the other; read
 * once. Process-wide, so it cannot make a row depend on its batch. */
static int attn_split_enabled(void)
{
    static int enabled = -1;
    int v = __atomic_load_n(&enabled, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("CAIRN_CUDA_SPLIT_ATTN");
        v = !(e && strcmp(e, "0") == 0);
        __atomic_store_n(&enabled, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* The number of chunks a row of `visible` keys is split into, else 0 (the
 * row kernel). A pure function of the row's visible key count and the shape
 * (n_head, head_dim) — never of the other sequences, the row count or the
 * device — so a row gets the same kernels, and the same bits, alone or in
 * any batch, as a decode row or a verification row. */
static int attn_split_count(int visible, int n_head, int head_dim)
{
    if (visible <= ATTN_SPLIT_MIN_KEYS || !attn_split_enabled())
        return 0;
    const int n_chunks = (visible + ATTN_SPLIT_CHUNK - 1) / ATTN_SPLIT_CHUNK;
    if (attn_split_bytes(n_chunks, n_head, head_dim) > ATTN_SPLIT_SCRATCH_MAX)
        return 0;
    return n_chunks;
}

/* The visible keys of an unlisted decode row (one query row, no mask):
 * [*j_lo, q_index + 1) after the window. */
static int decode_row_keys(const cairn_attn_seq *seq, int window, int *j_lo)
{
    const int qi = seq->q_index[0];
    int lo = 0;
    if (window > 0) {
        lo = qi - window + 1;
        lo = lo > 0 ? lo : 0;
    }
    *j_lo = lo;
    return qi + 1 - lo;
}

/* The visible keys of row i of a masked sequence, in index order: the run
 * [*j_lo, *j_lo + *n_run) from the first visible key, then the others
 * (written to tail when it is not NULL). Returns their number. A key is
 * visible when the mask says so and, with a window, j > q_index - window. */
static int masked_row_keys(const cairn_attn_seq *seq, int i, int window, int *j_lo, int *n_run,
                           int32_t *tail)
{
    const uint8_t *mask = seq->mask + (size_t)i * seq->n_kv;
    int lo = 0;
    if (window > 0) {
        lo = seq->q_index[i] - window + 1;
        lo = lo > 0 ? lo : 0;
    }
    int j = lo;
    while (j < seq->n_kv && !mask[j])
        j++;
    *j_lo = j;
    const int run_start = j;
    while (j < seq->n_kv && mask[j])
        j++;
    *n_run = j - run_start;
    int n = *n_run;
    for (; j < seq->n_kv; j++)
        if (mask[j]) {
            if (tail)
                tail[n - *n_run] = j;
            n++;
        }
    return n;
}

/* Both passes for the split rows r_lo .. r_hi - 1, whose chunks are
 * c_lo .. c_hi - 1 of the chunk table and whose partials start at part. */
static int attn_split_launch(cuda_ctx *ctx, const cairn_attn_args *a, const uint8_t *pool,
                             size_t head_bytes, float *part, const attn_split_row *srows,
                             const int32_t *chunks, const int32_t *ints, int64_t r_lo,
                             int64_t r_hi, int64_t c_lo, int64_t c_hi)
{
    const cairn_kv_layout *L = a->kv;
    const int group = a->n_head / L->n_kv_head;
    const int n_slices = (group + ATTN_SPLIT_G - 1) / ATTN_SPLIT_G;
    const dim3 grid1((unsigned)(c_hi - c_lo), (unsigned)(L->n_kv_head * n_slices));
    const int32_t *ch = chunks + 2 * c_lo;
#define ATTN_SPLIT_LAUNCH(KT)                                                                      \
    attention_split_kernel<KT><<<grid1, ATTN_THREADS, 0, ctx->stream>>>(                           \
        part, a->q, pool, a->layer, L->head_dim, L->page_size, head_bytes, L->rotation,            \
        L->row_bytes, L->page_bytes, a->n_head, group, n_slices, a->scale, srows, ch, ints)
    CUDA_KV_TYPE_DISPATCH(L->dtype, ATTN_SPLIT_LAUNCH)
#undef ATTN_SPLIT_LAUNCH
    CUDA_LAUNCHED("attention_split");
    const dim3 grid2((unsigned)(r_hi - r_lo), (unsigned)a->n_head);
    attention_combine_kernel<<<grid2, ATTN_THREADS, 0, ctx->stream>>>(
        a->out, part, L->head_dim, a->n_head, L->rotation, srows + r_lo, a->sinks);
    CUDA_LAUNCHED("attention_combine");
    return CAIRN_OK;
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
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);
    const int hd = L->head_dim, W = a->window;

    /* Where each row goes: a prefill (several query rows, no mask) to the
     * tiled kernel when the head fits its shared memory; a decode row
     * (one query row, no mask) and every row of a masked sequence (listed
     * by its visible keys) to the split path when it has enough visible
     * keys (attn_split_count), else to the row kernel.
     * Pass 1 sizes: split rows are taken in order into launch groups of at
     * most ATTN_SPLIT_SCRATCH_MAX bytes of partials, which run one after
     * the other in the same scratch. The grouping depends on the batch,
     * the values do not. */
    const int tiled_hd = hd <= ATTN_TILE_MAX_HD;
    int64_t n_split = 0, n_chunks = 0, n_rows = 0, n_tiles = 0, n_ints = 0;
    size_t group_bytes = 0, scratch_bytes = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        const cairn_attn_seq *seq = &a->seqs[s];
        n_ints += (seq->n_kv + L->page_size - 1) / L->page_size;
        if (!seq->mask && tiled_hd && seq->n_q >= ATTN_TILE_MIN_ROWS) {
            n_tiles += (seq->n_q + ATTN_TILE_Q - 1) / ATTN_TILE_Q;
            n_ints += seq->n_q;
            continue;
        }
        if (!seq->mask)
            n_ints += seq->n_q;
        for (int i = 0; i < seq->n_q; i++) {
            int j_lo, n_run, visible, nc = 0;
            if (seq->mask) {
                visible = masked_row_keys(seq, i, W, &j_lo, &n_run, NULL);
                n_ints += visible - n_run;
            } else {
                visible = seq->n_q == 1 ? decode_row_keys(seq, W, &j_lo) : 0;
            }
            nc = attn_split_count(visible, a->n_head, hd);
            if (nc == 0) {
                n_rows++;
                continue;
            }
            const size_t b = attn_split_bytes(nc, a->n_head, hd);
            if (group_bytes + b > ATTN_SPLIT_SCRATCH_MAX)
                group_bytes = 0;
            group_bytes += b;
            scratch_bytes = group_bytes > scratch_bytes ? group_bytes : scratch_bytes;
            n_split++;
            n_chunks += nc;
        }
    }
    if (n_chunks > INT32_MAX || n_rows + n_split > INT32_MAX || n_tiles > INT32_MAX ||
        n_ints > INT32_MAX)
        return CAIRN_EINVAL;
    int use_split = n_split > 0;
    void *part = NULL;
    if (use_split) {
        /* the matmul scratch: grown (after the stream drains) only when too
         * small, so no allocation in the steady state; everything that
         * uses it later is ordered after both passes on the stream */
        /* asked for in powers of two (1 MiB up to the 64 MiB bound), so
         * that contexts growing step by step grow it a handful of times,
         * not every few hundred steps (each growth drains the stream and
         * abandons a graph capture) */
        size_t want = (size_t)1 << 20;
        while (want < scratch_bytes)
            want <<= 1;
        rc = cuda_scratch_reserve(ctx, want, &part);
        if (rc == CAIRN_ENOMEM && want > scratch_bytes)
            rc = cuda_scratch_reserve(ctx, scratch_bytes, &part);
        if (rc == CAIRN_ENOMEM) {
            /* the one exception to the batch rule: out of device memory,
             * these rows fall back to the row kernel (other bits, same
             * answer within rounding) rather than fail the step */
            cairn_log(CAIRN_LOG_WARN,
                      "cuda attention: no %.1f MiB for split-KV partials; the row kernel "
                      "takes the long rows",
                      (double)scratch_bytes / (1 << 20));
            use_split = 0;
            n_rows += n_split;
            n_split = n_chunks = 0;
        } else if (rc != CAIRN_OK) {
            return rc;
        }
    }

    const size_t desc_bytes = ((size_t)a->n_seqs * sizeof(attn_seq_desc) + 15) / 16 * 16;
    const size_t rows_bytes = ((size_t)n_rows * ATTN_ROW_INFO * sizeof(int32_t) + 15) / 16 * 16;
    const size_t tiles_bytes = ((size_t)n_tiles * sizeof(attn_qtile) + 15) / 16 * 16;
    const size_t srows_bytes = ((size_t)n_split * sizeof(attn_split_row) + 15) / 16 * 16;
    const size_t chunks_bytes = ((size_t)n_chunks * 2 * sizeof(int32_t) + 15) / 16 * 16;
    const size_t ints_bytes = ((size_t)n_ints * sizeof(int32_t) + 15) / 16 * 16;
    const size_t off_rows = desc_bytes, off_tiles = off_rows + rows_bytes;
    const size_t off_srows = off_tiles + tiles_bytes, off_chunks = off_srows + srows_bytes;
    const size_t off_ints = off_chunks + chunks_bytes;
    const size_t total = off_ints + ints_bytes;
    uint8_t *host, *dev;
    if ((rc = cuda_stage_reserve(ctx, total, &host, &dev)) != CAIRN_OK)
        return rc;
    attn_seq_desc *descs = (attn_seq_desc *)host;
    int32_t *row_info = (int32_t *)(host + off_rows);
    attn_qtile *tiles = (attn_qtile *)(host + off_tiles);
    int32_t *ints = (int32_t *)(host + off_ints);
    attn_split_row *srows = (attn_split_row *)(host + off_srows);
    int32_t *chunk_tab = (int32_t *)(host + off_chunks);
    int64_t row = 0, tile = 0, io = 0, sr = 0, ci = 0, group_chunks = 0;
    group_bytes = 0;
    /* Pass 2 stages, in the same order: no mask is staged (masked rows are
     * listed), every sequence's q_index is (windows, decode rows). */
    for (int s = 0; s < a->n_seqs; s++) {
        const cairn_attn_seq *seq = &a->seqs[s];
        attn_seq_desc *d = &descs[s];
        d->q_start = seq->q_start;
        d->n_q = seq->n_q;
        d->n_kv = seq->n_kv;
        d->has_mask = 0;
        d->mask_off = -1;
        d->qidx_off = -1;
        const int n_pages = (seq->n_kv + L->page_size - 1) / L->page_size;
        d->pages_off = io;
        memcpy(ints + io, seq->pages, (size_t)n_pages * sizeof(int32_t));
        io += n_pages;
        if (!seq->mask) {
            d->qidx_off = io;
            memcpy(ints + io, seq->q_index, (size_t)seq->n_q * sizeof(int32_t));
            io += seq->n_q;
        }
        if (!seq->mask && tiled_hd && seq->n_q >= ATTN_TILE_MIN_ROWS) {
            for (int i0 = 0; i0 < seq->n_q; i0 += ATTN_TILE_Q, tile++) {
                tiles[tile].seq = s;
                tiles[tile].i0 = i0;
                tiles[tile].n = seq->n_q - i0 < ATTN_TILE_Q ? seq->n_q - i0 : ATTN_TILE_Q;
            }
            continue;
        }
        for (int i = 0; i < seq->n_q; i++) {
            int j_lo = -1, n_run = 0, visible = 0;
            int64_t tail_off = -1;
            if (seq->mask) {
                visible = masked_row_keys(seq, i, W, &j_lo, &n_run, ints + io);
                if (visible > n_run) {
                    tail_off = io;
                    io += visible - n_run;
                }
            } else if (seq->n_q == 1) {
                visible = decode_row_keys(seq, W, &j_lo);
                n_run = visible;
            }
            const int nc = use_split ? attn_split_count(visible, a->n_head, hd) : 0;
            if (nc > 0) {
                /* the same grouping as the sizing pass */
                const size_t b = attn_split_bytes(nc, a->n_head, hd);
                if (group_bytes + b > ATTN_SPLIT_SCRATCH_MAX) {
                    group_bytes = 0;
                    group_chunks = 0;
                }
                group_bytes += b;
                attn_split_row *r = &srows[sr];
                r->q_row = seq->q_start + i;
                r->j_lo = j_lo;
                r->n_run = n_run;
                r->n_vis = visible;
                r->n_chunks = nc;
                r->pages_off = d->pages_off;
                r->tail_off = tail_off;
                r->part_base = group_chunks;
                group_chunks += nc;
                for (int c = 0; c < nc; c++, ci++) {
                    chunk_tab[2 * ci] = (int32_t)sr;
                    chunk_tab[2 * ci + 1] = c;
                }
                sr++;
                continue;
            }
            int32_t *ri = row_info + (size_t)ATTN_ROW_INFO * row++;
            ri[0] = s;
            ri[1] = i;
            /* a decode row keeps its own path (q_index, window); a masked
             * row is listed */
            ri[2] = seq->mask ? j_lo : -1;
            ri[3] = n_run;
            ri[4] = visible;
            ri[5] = (int32_t)tail_off;
        }
    }
    /* every layer of a step stages the same tables: sent once per step */
    if ((rc = cuda_stage_commit(ctx, host, &dev, total)) != CAIRN_OK)
        return rc;

    const uint8_t *pool = (const uint8_t *)a->kv_pool + L->layer_base;
    const int R = L->rotation;
    if (n_split > 0) {
        /* launch group by group, the same grouping again (from the host
         * copy of the split rows) */
        int64_t r_lo = 0, c_lo = 0, c = 0;
        group_bytes = 0;
        for (int64_t r = 0; r <= n_split; r++) {
            const size_t b = r < n_split ? attn_split_bytes(srows[r].n_chunks, a->n_head, hd) : 0;
            if (r == n_split || group_bytes + b > ATTN_SPLIT_SCRATCH_MAX) {
                if (r > r_lo &&
                    (rc = attn_split_launch(ctx, a, pool, head_bytes, (float *)part,
                                            (const attn_split_row *)(dev + off_srows),
                                            (const int32_t *)(dev + off_chunks),
                                            (const int32_t *)(dev + off_ints), r_lo, r, c_lo,
                                            c)) != CAIRN_OK)
                    return rc;
                r_lo = r;
                c_lo = c;
                group_bytes = 0;
            }
            if (r == n_split)
                break;
            group_bytes += b;
            c += srows[r].n_chunks;
        }
    }
    if (n_rows > 0) {
        dim3 grid((unsigned)n_rows, (unsigned)a->n_head);
#define ATTN_ROW_LAUNCH(KT)                                                                        \
    attention_kernel<KT><<<grid, ATTN_THREADS, 0, ctx->stream>>>(                                  \
        a->out, a->q, pool, a->layer, L->n_kv_head, L->head_dim, L->page_size, head_bytes, R, W,   \
        L->row_bytes, L->page_bytes, a->n_head, a->scale, (const attn_seq_desc *)dev,             \
        (const int32_t *)(dev + off_rows), (const int32_t *)(dev + off_ints), NULL, a->sinks)
        CUDA_KV_TYPE_DISPATCH(L->dtype, ATTN_ROW_LAUNCH)
#undef ATTN_ROW_LAUNCH
        CUDA_LAUNCHED("attention");
    }
    if (n_tiles > 0) {
        const size_t smem =
            (size_t)(ATTN_TILE_Q * hd + ATTN_TILE_K * (hd + 1) + ATTN_TILE_K * hd) * sizeof(float);
        dim3 grid((unsigned)n_tiles, (unsigned)a->n_head);
        const unsigned threads = 32 * ATTN_TILE_Q / ATTN_TILE_ROWS_PER_WARP;
#define ATTN_TILE_LAUNCH(KT)                                                                       \
    attention_tile_kernel<KT><<<grid, threads, smem, ctx->stream>>>(                               \
        a->out, a->q, pool, a->layer, L->n_kv_head, hd, L->page_size, head_bytes, R, W,            \
        L->row_bytes, L->page_bytes, a->n_head, a->scale, (const attn_seq_desc *)dev,             \
        (const attn_qtile *)(dev + off_tiles), (const int32_t *)(dev + off_ints), NULL, a->sinks)
        CUDA_KV_TYPE_DISPATCH(L->dtype, ATTN_TILE_LAUNCH)
#undef ATTN_TILE_LAUNCH
        CUDA_LAUNCHED("attention_tile");
    }
    return CAIRN_OK;
}
