/*
 * kernels/cuda/cuda_sample.cu — the sample_rows slot: one token per row of
 * logits, drawn on the device, so a decode step downloads token ids (and
 * the logprobs asked for) instead of [rows][n_vocab] floats.
 *
 * Semantics are model/sampler.c's, step for step (read its header):
 *
 *   input   raw logit, NaN -> -inf, grammar-disallowed -> -inf
 *   work    input; += bias (from the input value); penalties from the
 *           biased input with the CPU's float expressions (explicit _rn
 *           intrinsics, so nvcc cannot contract them into FMAs)
 *   refuse  the input row has no finite maximum (all -inf, or a +inf)
 *   greedy  argmax of work, ties to the lowest id
 *   sample  candidates: top-k (ties to the lower id) ∩ min-p
 *           (work >= best + logf(min_p), in float; logf is taken on the host
 *           so the threshold is the CPU's to the bit), then top-p: the
 *           shortest best-first prefix of those whose mass exp(w - best)
 *           reaches top_p times the mass of the whole top-k set (the CPU
 *           takes that normaliser before min-p, and so does this); then
 *           weights exp((w - best) / T) and one draw x = u * total over the
 *           candidates in the CPU's order: best first when top-k or top-p is
 *           on (the CPU sorts then), id order otherwise (it does not).
 *
 * How without sorting 150k floats: every best-first prefix of the total
 * order (logit descending, id ascending) is named by its last element
 * (key, id), where key is the float's bits mapped to an unsigned integer
 * that orders like the float (±0 made one). Top-k, the top-p cut and the
 * draw are each such a prefix, found by a radix select over the key's four
 * bytes, most significant first: a pass builds a 256-bin histogram (counts
 * for top-k, masses for top-p and the draw) of the elements that share the
 * bytes chosen so far, and a walk from the top bin finds the bin where the
 * count or the cumulative mass crosses its target. After four passes the
 * boundary key is known; elements with exactly that value all weigh the
 * same, so how many of them the prefix takes is arithmetic, and which ones
 * (the lowest ids) an id-ordered scan finds. The id-ordered draw is a block
 * scan over contiguous id chunks. One block of 1024 threads per row; about
 * 16 passes over the row in all, from L2.
 *
 * Where results may differ from the CPU's: the CPU adds masses one by one
 * in candidate order (double); here they are added per bin and per thread
 * (double, shared-memory atomics, so their order is not fixed either), and
 * exp() is CUDA's (<= 1 ulp off in double) rather than the C library's. A
 * cumulative sum differs by a few units of 2^-53 of the total, so a draw or
 * a top-p cut can only fall differently when u (or top_p) lies within ~1e-13
 * relative of a boundary. Logprobs are log-softmax of the input row in
 * double like the CPU's, rounded to float: equal to within 1 float ulp.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

#define SAMPLE_THREADS 1024
#define RADIX_BINS 256

/* A row as the kernel reads it: the slot's cairn_sample_row with host
 * pointers turned into offsets into one staged block. */
typedef struct {
    double u;
    float temperature, top_p, min_p, log_min_p;
    float repeat, frequency, presence;
    int row, top_k, n_pen, n_bias, want_lp, n_lp;
    int has_allowed;
    size_t allowed_off, pen_off, bias_off; /* bytes from the block's start */
} dev_row;

/* ---- keys and prefixes of the total order ------------------------------------ */

/* The float's order as an unsigned integer: larger key, larger float. Never
 * sees NaN (inputs are cleaned first); -0 and +0 get one key, since the CPU
 * compares them equal and breaks the tie by id. */
static __device__ __forceinline__ uint32_t fkey(float f)
{
    uint32_t b = __float_as_uint(f);
    if ((b & 0x7fffffffu) == 0)
        b = 0; /* -0 -> +0 */
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static __device__ __forceinline__ float key_float(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* A best-first prefix, named by its last element: it holds exactly the
 * elements with key > key, or key == key and id <= id. */
typedef struct {
    uint32_t key;
    int id;
} prefix;

static __device__ __forceinline__ bool in_prefix(uint32_t key, int id, prefix p)
{
    return key > p.key || (key == p.key && id <= p.id);
}

/* The shorter of two prefixes (the one whose last element ranks first). */
static __device__ __forceinline__ prefix shorter(prefix a, prefix b)
{
    return (a.key > b.key || (a.key == b.key && a.id < b.id)) ? a : b;
}

/* (key, id) packed so that the largest value is the best-ranked element. */
static __device__ __forceinline__ unsigned long long rank_pack(uint32_t key, int id)
{
    return ((unsigned long long)key << 32) | (0xffffffffu - (uint32_t)id);
}

static __device__ __forceinline__ int rank_id(unsigned long long packed)
{
    return (int)(0xffffffffu - (uint32_t)(packed & 0xffffffffu));
}

/* ---- block primitives (blockDim.x == SAMPLE_THREADS) -------------------------- */

struct op_sum {
    template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct op_max {
    template <class T> __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct op_min {
    template <class T> __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};

/* Every thread gets op over all threads' v. Thread 0 combines the warps'
 * results in warp order, so the result does not depend on timing. */
template <class T, class Op> static __device__ T block_reduce(T v, Op op, T *shared /* [33] */)
{
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* shared may still be read by the previous reduction */
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        T acc = shared[0];
        for (int w = 1; w < (int)(blockDim.x / 32); w++)
            acc = op(acc, shared[w]);
        shared[32] = acc;
    }
    __syncthreads();
    return shared[32];
}

/* The sum of v over threads before this one; *total receives the sum over
 * all of them. */
template <class T> static __device__ T block_exclusive_scan(T v, T *total, T *shared /* [33] */)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    T inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        T up = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += up;
    }
    __syncthreads();
    if (lane == 31)
        shared[warp] = inc;
    __syncthreads();
    if (threadIdx.x == 0) {
        T acc = 0;
        for (int w = 0; w < (int)(blockDim.x / 32); w++) {
            T t = shared[w];
            shared[w] = acc;
            acc += t;
        }
        shared[32] = acc;
    }
    __syncthreads();
    const T before = shared[warp] + inc - v;
    *total = shared[32];
    return before;
}

/* This thread's contiguous chunk of ids, for the id-ordered scans. */
static __device__ __forceinline__ void my_chunk(int n, int *lo, int *hi)
{
    const int per = (n + (int)blockDim.x - 1) / (int)blockDim.x;
    *lo = (int)threadIdx.x * per < n ? (int)threadIdx.x * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

/* Shared state of one row's block. */
typedef struct {
    unsigned count_hist[RADIX_BINS];
    double mass_hist[RADIX_BINS];
    double red_d[33];
    float red_f[33];
    unsigned long long red_u64[33];
    int red_i[33];
    int pick_i;
    uint32_t pick_key;
    double pick_d;
    int found;
} row_shared;

/* The r-th lowest id (r >= 1) among the elements with key == k inside p;
 * *count receives how many there are. -1 when fewer than r. */
static __device__ int nth_tie(const float *work, int n, uint32_t k, prefix p, int r, int *count,
                              row_shared *sh)
{
    int lo, hi, c = 0;
    my_chunk(n, &lo, &hi);
    for (int i = lo; i < hi; i++) {
        const uint32_t key = fkey(work[i]);
        c += key == k && in_prefix(key, i, p);
    }
    int total;
    const int before = block_exclusive_scan(c, &total, sh->red_i);
    if (threadIdx.x == 0)
        sh->pick_i = -1;
    __syncthreads();
    if (r >= 1 && before < r && r <= before + c) {
        int j = before;
        for (int i = lo; i < hi; i++) {
            const uint32_t key = fkey(work[i]);
            if (key == k && in_prefix(key, i, p) && ++j == r) {
                sh->pick_i = i;
                break;
            }
        }
    }
    __syncthreads();
    *count = total;
    return sh->pick_i;
}

/* Top-k: the prefix of the k best elements (0 < k < n). */
static __device__ prefix select_top_k(const float *work, int n, int k, row_shared *sh)
{
    uint32_t want = 0, mask = 0;
    int need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < RADIX_BINS; b += blockDim.x)
            sh->count_hist[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t key = fkey(work[i]);
            if ((key & mask) == want)
                atomicAdd(&sh->count_hist[(key >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int acc = 0, b = RADIX_BINS - 1;
            for (; b > 0; b--) {
                if (acc + (int)sh->count_hist[b] >= need)
                    break;
                acc += (int)sh->count_hist[b];
            }
            sh->pick_key = (uint32_t)b;
            sh->pick_i = need - acc;
        }
        __syncthreads();
        want |= sh->pick_key << shift;
        mask |= 0xffu << shift;
        need = sh->pick_i;
        __syncthreads();
    }
    const prefix all = {0u, 0x7fffffff};
    int ties;
    const int id = nth_tie(work, n, want, all, need, &ties, sh);
    const prefix p = {want, id};
    return p;
}

/* Weights of the mass-based selections. */
struct w_top_p { /* exp(w - best): the CPU's top-p mass */
    double best;
    __device__ double operator()(float w) const { return exp((double)w - best); }
};
struct w_temp { /* exp((w - best) / T): the CPU's draw weights */
    double best, inv_t;
    __device__ double operator()(float w) const { return exp(((double)w - best) * inv_t); }
};

/* Sum of weight over the elements of prefix p. */
template <class W>
static __device__ double prefix_mass(const float *work, int n, prefix p, W weight, row_shared *sh)
{
    double m = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float w = work[i];
        if (in_prefix(fkey(w), i, p))
            m += weight(w);
    }
    return block_reduce(m, op_sum(), sh->red_d);
}

/* Within prefix s, best first: the first element at which the cumulative
 * weight reaches `target` (strict == false: cum >= target, top-p's rule) or
 * passes it (strict: cum > target, the draw's). Writes the prefix ending
 * there to *out and returns true; false when the whole of s does not get
 * there (rounding, or top-p keeping everything). */
template <class W>
static __device__ bool select_mass(const float *work, int n, prefix s, W weight, double target,
                                   bool strict, prefix *out, row_shared *sh)
{
    uint32_t want = 0, mask = 0;
    double above = 0.0; /* mass of the elements of s ranked above the bytes chosen */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < RADIX_BINS; b += blockDim.x)
            sh->mass_hist[b] = 0.0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float w = work[i];
            const uint32_t key = fkey(w);
            if ((key & mask) == want && in_prefix(key, i, s)) {
                const double m = weight(w);
                if (m > 0.0)
                    atomicAdd(&sh->mass_hist[(key >> shift) & 0xffu], m);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double acc = above;
            int b = RADIX_BINS - 1;
            for (; b >= 0; b--) {
                const double next = acc + sh->mass_hist[b];
                if (strict ? next > target : next >= target)
                    break;
                acc = next;
            }
            sh->found = b >= 0;
            sh->pick_key = b >= 0 ? (uint32_t)b : 0u;
            sh->pick_d = acc;
        }
        __syncthreads();
        if (!sh->found)
            return false;
        want |= sh->pick_key << shift;
        mask |= 0xffu << shift;
        above = sh->pick_d;
        __syncthreads();
    }
    /* The elements with key `want` all weigh e > 0 (their bin had mass):
     * the prefix takes the smallest r of them that gets there. */
    const double e = weight(key_float(want));
    const double gap = (target - above) / e;
    double r = strict ? floor(gap) + 1.0 : ceil(gap);
    int ties = 0;
    (void)nth_tie(work, n, want, s, 0, &ties, sh); /* how many there are */
    if (!(r >= 1.0))
        r = 1.0;
    if (r > (double)ties)
        r = (double)ties;
    const int id = nth_tie(work, n, want, s, (int)r, &ties, sh);
    out->key = want;
    out->id = id;
    return id >= 0;
}

/* The draw in id order (no top-k, no top-p: the CPU's candidates are then
 * in id order): the first id of prefix s at which the cumulative weight
 * passes x; the last id of s when rounding leaves x at the very end. */
static __device__ int draw_id_order(const float *work, int n, prefix s, w_temp weight, double x,
                                    row_shared *sh)
{
    int lo, hi, last = -1;
    my_chunk(n, &lo, &hi);
    double mine = 0.0;
    for (int i = lo; i < hi; i++) {
        const float w = work[i];
        if (in_prefix(fkey(w), i, s)) {
            mine += weight(w);
            last = i;
        }
    }
    double total;
    const double before = block_exclusive_scan(mine, &total, sh->red_d);
    const int last_all = block_reduce(last, op_max(), sh->red_i);
    /* The first chunk whose end passes x holds the crossing (the scan's sums
     * are rounded in their own order, so the chunks' ranges need not meet
     * exactly: the first one past x decides). Adding its weights in the same
     * order again reaches before + mine exactly at its end, so it finds one. */
    const int first = block_reduce(x < before + mine ? (int)threadIdx.x : 0x7fffffff, op_min(),
                                   sh->red_i);
    if (threadIdx.x == 0)
        sh->pick_i = last_all;
    __syncthreads();
    if ((int)threadIdx.x == first) {
        double cum = 0.0;
        for (int i = lo; i < hi; i++) {
            const float w = work[i];
            if (in_prefix(fkey(w), i, s)) {
                cum += weight(w);
                if (x < before + cum) {
                    sh->pick_i = i;
                    break;
                }
            }
        }
    }
    __syncthreads();
    return sh->pick_i;
}

/* The worst-ranked element of prefix s (the CPU's last candidate). */
static __device__ int last_of(const float *work, int n, prefix s, row_shared *sh)
{
    unsigned long long worst = ~0ull;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const uint32_t key = fkey(work[i]);
        if (in_prefix(key, i, s)) {
            const unsigned long long r = rank_pack(key, i);
            worst = r < worst ? r : worst;
        }
    }
    worst = block_reduce(worst, op_min(), sh->red_u64);
    return rank_id(worst);
}

/* ---- the row ------------------------------------------------------------------ */

static __device__ __forceinline__ float input_at(const float *raw, const uint32_t *allowed, int i)
{
    const float l = raw[i];
    if (allowed && !((allowed[i >> 5] >> (i & 31)) & 1u))
        return -INFINITY;
    return isnan(l) ? -INFINITY : l;
}

/* model/sampler.c's penalize(), in the same float operations. */
static __device__ float penalize(const dev_row *r, float logit, int count)
{
    if (isinf(logit))
        return logit;
    if (logit <= 0.0f)
        logit = __fmul_rn(logit, r->repeat);
    else
        logit = __fdiv_rn(logit, r->repeat);
    logit = __fsub_rn(logit, __fadd_rn(__fmul_rn((float)count, r->frequency), r->presence));
    if (isnan(logit) || logit < -FLT_MAX)
        return -FLT_MAX;
    return logit > FLT_MAX ? FLT_MAX : logit;
}

/* Registers: with 1,024 threads ptxas aims at two blocks an SM and so at
 * 32 registers, and spills 60 B (ptxas -v, sm_90: 32 B stack; the values
 * the temperature branch keeps across its block reductions). The kernel
 * needs 46 to spill nothing, and any count above 32 leaves room for one
 * block an SM only (__launch_bounds__(SAMPLE_THREADS, 1) gives 64 and no
 * spills). Kept as it is until a GPU measures the two: the spills are a
 * few L1-resident words per thread against passes over the whole row,
 * while the second block an SM is what a batch of more rows than SMs
 * runs on. */
static __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows_kernel(const float *logits, float *work_all, int n_vocab, const uint8_t *block,
                       int32_t *tokens, cairn_sample_logprob *lp_out)
{
    __shared__ row_shared sh;
    const int row_i = blockIdx.x, n = n_vocab;
    const dev_row *r = (const dev_row *)block + row_i;
    const float *raw = logits + (size_t)r->row * n;
    float *work = work_all + (size_t)row_i * n;
    const uint32_t *allowed =
        r->has_allowed ? (const uint32_t *)(block + r->allowed_off) : NULL;

    /* input and its maximum */
    float raw_max = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = input_at(raw, allowed, i);
        work[i] = v;
        raw_max = v > raw_max ? v : raw_max;
    }
    raw_max = block_reduce(raw_max, op_max(), sh.red_f);
    if (!isfinite(raw_max)) {
        if (threadIdx.x == 0)
            tokens[row_i] = -1;
        return;
    }

    /* bias, then penalties from the biased input (a token listed twice
     * writes the same value twice) */
    const cairn_sample_bias *bias = (const cairn_sample_bias *)(block + r->bias_off);
    for (int i = threadIdx.x; i < r->n_bias; i += blockDim.x) {
        const int t = bias[i].token;
        work[t] = __fadd_rn(input_at(raw, allowed, t), bias[i].bias);
    }
    __syncthreads();
    const cairn_sample_penalty *pen = (const cairn_sample_penalty *)(block + r->pen_off);
    for (int i = threadIdx.x; i < r->n_pen; i += blockDim.x) {
        const int t = pen[i].token;
        work[t] = penalize(r, __fadd_rn(input_at(raw, allowed, t), pen[i].bias), pen[i].count);
    }
    __syncthreads();

    /* the best element of the working row: greedy's answer, and the
     * reference of every weight */
    unsigned long long best_rank = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const unsigned long long k = rank_pack(fkey(work[i]), i);
        best_rank = k > best_rank ? k : best_rank;
    }
    best_rank = block_reduce(best_rank, op_max(), sh.red_u64);
    const int best = rank_id(best_rank);
    int picked = best;

    if (r->temperature > 0.0f) {
        const float best_logit = work[best]; /* finite: penalize() caps it */
        const prefix all = {0u, 0x7fffffff};
        const bool top_k_on = r->top_k > 0 && r->top_k < n;
        const prefix k_set = top_k_on ? select_top_k(work, n, r->top_k, &sh) : all;
        const bool top_p_on = r->top_p < 1.0f;
        const w_top_p wp = {(double)best_logit};
        const double z = top_p_on ? prefix_mass(work, n, k_set, wp, &sh) : 0.0;
        prefix cand = k_set;
        if (r->min_p > 0.0f) {
            const prefix min_set = {fkey(__fadd_rn(best_logit, r->log_min_p)), 0x7fffffff};
            cand = shorter(cand, min_set);
        }
        prefix cut;
        if (top_p_on && select_mass(work, n, cand, wp, (double)r->top_p * z, false, &cut, &sh))
            cand = shorter(cand, cut);

        const w_temp wt = {(double)best_logit, 1.0 / (double)r->temperature};
        const double total = prefix_mass(work, n, cand, wt, &sh);
        const double x = r->u * total;
        if (top_k_on || top_p_on) {
            prefix hit;
            const bool found = select_mass(work, n, cand, wt, x, true, &hit, &sh);
            picked = found ? hit.id : last_of(work, n, cand, &sh); /* x at the very end */
        } else {
            picked = draw_id_order(work, n, cand, wt, x, &sh);
        }
    }

    /* logprobs: log-softmax of the input row in double */
    if (r->want_lp) {
        double sum = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            sum += exp((double)input_at(raw, allowed, i) - (double)raw_max);
        sum = block_reduce(sum, op_sum(), sh.red_d);
        const double log_z = (double)raw_max + log(sum);
        cairn_sample_logprob *lp = lp_out + (size_t)row_i * (1 + CAIRN_SAMPLE_MAX_LOGPROBS);
        /* the best n_lp of the input, one block argmax each, each strictly
         * after the previous one in the total order */
        unsigned long long prev = ~0ull;
        for (int j = 0; j < r->n_lp; j++) {
            unsigned long long top = 0;
            bool any = false;
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const unsigned long long k = rank_pack(fkey(input_at(raw, allowed, i)), i);
                if (k < prev && k >= top) {
                    top = k;
                    any = true;
                }
            }
            const int n_any = block_reduce(any ? 1 : 0, op_sum(), sh.red_i);
            top = block_reduce(top, op_max(), sh.red_u64);
            if (threadIdx.x == 0) {
                if (n_any > 0) {
                    const int id = rank_id(top);
                    lp[1 + j].token = id;
                    lp[1 + j].logprob = (float)((double)input_at(raw, allowed, id) - log_z);
                } else { /* a vocabulary smaller than n_logprobs */
                    lp[1 + j].token = -1;
                    lp[1 + j].logprob = -INFINITY;
                }
            }
            prev = top;
            if (n_any == 0)
                prev = 0; /* nothing ranks below: the rest are past the vocabulary */
        }
        if (threadIdx.x == 0) {
            lp[0].token = picked;
            lp[0].logprob = (float)((double)input_at(raw, allowed, picked) - log_z);
        }
    }
    if (threadIdx.x == 0)
        tokens[row_i] = picked;
}

/* ---- the slot ------------------------------------------------------------------ */

static size_t align16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

int cuda_sample_rows(cairn_backend *be, const float *logits, int n_rows, int n_vocab,
                     const cairn_sample_row *rows, int32_t *tokens, cairn_sample_logprob *lp)
{
    if (!be || !logits || !rows || !tokens || n_rows <= 0 || n_vocab <= 0)
        return CAIRN_EINVAL;
    /* The checks the kernel relies on: ids inside the row, sizes in range. */
    const size_t words = ((size_t)n_vocab + 31) / 32;
    size_t bytes = align16((size_t)n_rows * sizeof(dev_row));
    for (int i = 0; i < n_rows; i++) {
        const cairn_sample_row *r = &rows[i];
        if (r->row < 0 || r->n_penalties < 0 || r->n_bias < 0 ||
            (r->n_penalties > 0 && !r->penalties) || (r->n_bias > 0 && !r->bias) ||
            r->n_logprobs < 0 ||
            r->n_logprobs > CAIRN_SAMPLE_MAX_LOGPROBS || !(r->u >= 0.0 && r->u < 1.0) ||
            !(r->min_p >= 0.0f && r->min_p <= 1.0f) || !(r->top_p > 0.0f && r->top_p <= 1.0f) ||
            !isfinite(r->temperature))
            return CAIRN_EINVAL;
        for (int j = 0; j < r->n_penalties; j++)
            if (r->penalties[j].token < 0 || r->penalties[j].token >= n_vocab ||
                r->penalties[j].count <= 0)
                return CAIRN_EINVAL;
        for (int j = 0; j < r->n_bias; j++)
            if (r->bias[j].token < 0 || r->bias[j].token >= n_vocab)
                return CAIRN_EINVAL;
        if (r->allowed)
            bytes += align16(words * sizeof(uint32_t));
        bytes += align16((size_t)r->n_penalties * sizeof(cairn_sample_penalty));
        bytes += align16((size_t)r->n_bias * sizeof(cairn_sample_bias));
    }
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);

    /* one staged block: the rows, then each row's mask, penalties, biases */
    uint8_t *host, *dev;
    rc = cuda_stage_reserve(ctx, bytes, &host, &dev);
    if (rc != CAIRN_OK)
        return rc;
    dev_row *dr = (dev_row *)host;
    size_t off = align16((size_t)n_rows * sizeof(dev_row));
    for (int i = 0; i < n_rows; i++) {
        const cairn_sample_row *r = &rows[i];
        dev_row d;
        memset(&d, 0, sizeof d);
        d.u = r->u;
        d.row = r->row;
        d.temperature = r->temperature;
        d.top_p = r->top_p;
        d.min_p = r->min_p;
        /* the host's logf: the CPU's min-p threshold to the bit */
        d.log_min_p = r->min_p > 0.0f ? logf(r->min_p) : 0.0f;
        d.repeat = r->repeat_penalty;
        d.frequency = r->frequency_penalty;
        d.presence = r->presence_penalty;
        d.top_k = r->top_k;
        d.n_pen = r->n_penalties;
        d.n_bias = r->n_bias;
        d.want_lp = r->want_logprobs != 0 && lp != NULL;
        d.n_lp = d.want_lp ? r->n_logprobs : 0;
        if (r->allowed) {
            d.has_allowed = 1;
            d.allowed_off = off;
            memcpy(host + off, r->allowed, words * sizeof(uint32_t));
            off += align16(words * sizeof(uint32_t));
        }
        d.pen_off = off;
        if (r->n_penalties > 0)
            memcpy(host + off, r->penalties, (size_t)r->n_penalties * sizeof(cairn_sample_penalty));
        off += align16((size_t)r->n_penalties * sizeof(cairn_sample_penalty));
        d.bias_off = off;
        if (r->n_bias > 0)
            memcpy(host + off, r->bias, (size_t)r->n_bias * sizeof(cairn_sample_bias));
        off += align16((size_t)r->n_bias * sizeof(cairn_sample_bias));
        dr[i] = d;
    }
    rc = cuda_stage_send(ctx, host, dev, bytes);
    if (rc != CAIRN_OK)
        return rc;

    /* device scratch: the working rows, then the results */
    const size_t work_bytes = align16((size_t)n_rows * n_vocab * sizeof(float));
    const size_t tok_bytes = align16((size_t)n_rows * sizeof(int32_t));
    const size_t lp_bytes =
        (size_t)n_rows * (1 + CAIRN_SAMPLE_MAX_LOGPROBS) * sizeof(cairn_sample_logprob);
    void *scratch;
    rc = cuda_scratch_reserve(ctx, work_bytes + tok_bytes + lp_bytes, &scratch);
    if (rc != CAIRN_OK)
        return rc;
    float *work = (float *)scratch;
    int32_t *tok_dev = (int32_t *)((uint8_t *)scratch + work_bytes);
    cairn_sample_logprob *lp_dev =
        (cairn_sample_logprob *)((uint8_t *)scratch + work_bytes + tok_bytes);

    sample_rows_kernel<<<n_rows, SAMPLE_THREADS, 0, ctx->stream>>>(logits, work, n_vocab, dev,
                                                                   tok_dev, lp_dev);
    CUDA_LAUNCHED("sample_rows");
    CUDA_TRY(cudaMemcpyAsync(tokens, tok_dev, (size_t)n_rows * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, ctx->stream));
    if (lp)
        CUDA_TRY(cudaMemcpyAsync(lp, lp_dev, lp_bytes, cudaMemcpyDeviceToHost, ctx->stream));
    CUDA_TRY(cudaStreamSynchronize(ctx->stream));
    return CAIRN_OK;
}
