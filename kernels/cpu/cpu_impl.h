/*
 * kernels/cpu/cpu_impl.h — internals of the CPU backend, shared by the files
 * of kernels/cpu/ and included by nothing outside that folder.
 *
 * Structure
 * ---------
 *   cpu_pool.c       a persistent worker pool and its parallel-for
 *   cpu_backend.c    create/destroy, memory ops, the function table
 *   cpu_matmul.c     get_rows, matmul and matmul_multi (weights in GGUF
 *                    block layout or packed): argument checks, the choice of
 *                    kernel, and the scalar reference kernels
 *   cpu_pack.c       the packed weight layout (below) and the weight_layout
 *                    and upload_weight slots
 *   cpu_tune.c       the kernels' speed knobs, measured once per machine
 *   cpu_x86*.c       AVX2 and AVX-512 (VNNI) kernels, compiled with function
 *                    target attributes so a build without -march=native still
 *                    contains them; chosen at run time by CPUID. cpu_x86.c
 *                    (level detection, activation quantization), then one
 *                    file per kernel family: _float (F32/F16/BF16/F8_E4M3
 *                    weights, GGUF rows and packed groups), _quant (every
 *                    quantized type, packed groups), _attention (attention
 *                    and element-wise helpers); what they share is in
 *                    cpu_x86_impl.h
 *   cpu_ops.c        rmsnorm, rope, swiglu, geglu, add, scale, gather_cols, softmax
 *   cpu_attention.c  kv_store and attention over paged KV
 *
 * Determinism: every parallel op splits its work into independent items
 * (an output row, a token, a (query row, head) pair) and each item is
 * computed by the same sequential code whichever thread runs it, so results
 * are bitwise identical for any thread count.
 */
#ifndef CAIRN_KERNELS_CPU_IMPL_H
#define CAIRN_KERNELS_CPU_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"

/* ---- worker pool ------------------------------------------------------- */

typedef struct cpu_pool cpu_pool;

/* Work function of a parallel-for: handle items [begin, end). `thread` is in
 * [0, n_threads) and unique among the threads running concurrently, so it can
 * index per-thread scratch memory. */
typedef void (*cpu_range_fn)(void *arg, int64_t begin, int64_t end, int thread);

/* Start n_threads - 1 workers (the calling thread is the n-th). n_threads must
 * be >= 1; with 1 no thread is started. CAIRN_ENOMEM when a thread cannot be
 * created (the ones already started are joined again). */
int cpu_pool_create(int n_threads, cpu_pool **out);
/* Wake, stop and join every worker. NULL is a no-op. */
void cpu_pool_destroy(cpu_pool *pool);
int cpu_pool_threads(const cpu_pool *pool);

/* Run fn over items [0, n_items), handing out chunks of at least `min_chunk`
 * items to the workers and the calling thread, and return when all are done.
 * Runs inline on the calling thread when the pool has one thread or there is
 * only one chunk. Must only be called from the thread that owns the backend
 * (it is not re-entrant). */
void cpu_pool_parallel_for(cpu_pool *pool, int64_t n_items, int64_t min_chunk, cpu_range_fn fn,
                           void *arg);

/* ---- instruction-set levels -------------------------------------------- */

/* What the kernels may use, in increasing order. The level is chosen once
 * per backend from CPUID (__builtin_cpu_supports), capped by the environment
 * variable CAIRN_CPU_ISA=scalar|avx2|avx512 (for testing the lower levels
 * and for comparisons). */
typedef enum {
    CPU_ISA_SCALAR = 0, /* portable C: the reference                         */
    CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C                                 */
    CPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL + VNNI (+ the AVX2 set)           */
} cpu_isa;

/* The best level this CPU supports, capped by CAIRN_CPU_ISA. */
cpu_isa cpu_isa_detect(void);
const char *cpu_isa_name(cpu_isa isa);
/* Whether the CPU has AVX512_BF16 and the level is AVX-512 (the BF16
 * weights' dot-product kernels); CAIRN_CPU_BF16=0 says no, for tests and
 * comparisons. */
int cpu_has_bf16(cpu_isa isa);

/* ---- backend context --------------------------------------------------- */

/* Most matrices one matmul_multi call runs in one pass. */
#define CPU_MULTI_MAX 4

/* Knobs of the quantized kernels that do not change a single bit of their
 * results, only their speed, which differs between microarchitectures:
 * chosen per machine by a short measurement (cpu_tune.c). */
typedef struct {
    int prefetch;    /* bytes ahead of the weight stream prefetched into L2;
                        0: none (the hardware prefetchers alone)          */
    int pair_tokens; /* AVX-512: up to this many tokens, two groups (32
                        rows) share each activation broadcast             */
} cpu_quant_tuning;

/* The knobs before (or without) a measurement (cpu_tune.c). */
void cpu_tune_defaults(cpu_quant_tuning *t);


/* A big allocation of the backend, mapped on its own (cpu_backend.c). */
typedef struct {
    void *base;
    size_t len;
} cpu_map;

typedef struct {
    cpu_pool *pool;
    int n_threads;
    cpu_isa isa;
    /* Quantized weights (Q8_0, Q4_0, Q5_0, Q4_Z, MXFP4, Q4_K, Q5_K, Q6_K): when 0 (the
     * default) activations are quantized to 8 bits per 32-element block on
     * the fly and multiplied in integers, as llama.cpp does (see
     * cpu_q8act_type); when 1 (CAIRN_CPU_EXACT_MATMUL=1 at creation) every
     * weight type uses the float reference semantics (weights dequantized,
     * float activations). F32/F16/BF16/F8_E4M3 weights are always exact. */
    int quantize_activations;
    /* BF16 weights: 1 when they multiply activations rounded to bf16 with
     * vdpbf16ps (AVX512_BF16, not exact mode; cpu_x86_float.c), 0 when
     * they multiply float activations exactly. */
    int bf16_dot;
    uint16_t *act_bf16; /* [T][n_in] activations as bf16, grown like scratch */
    size_t act_bf16_cap;
    /* Speed knobs of the quantized kernels (cpu_x86_gemm_groups). */
    cpu_quant_tuning tune;
    /* Activations quantized for the current matmul (cpu_act's layout, room
     * for act_cap entries of 32 codes; grown, never shrunk, like scratch):
     * codes, scales, sums, half sums, and CPU_MULTI_MAX sets of the three
     * correction arrays (one per part of a matmul_multi call). */
    int8_t *act_q;
    float *act_d;
    int32_t *act_s, *act_s_lo;
    int32_t *act_corr; /* [CPU_MULTI_MAX][3][act_cap]: zi, zi2, zf (as float) */
    size_t act_cap;
    /* Per-thread scratch: n_threads slices of scratch_stride floats each,
     * grown (never shrunk) by cpu_scratch_reserve on the owning thread
     * before a parallel-for; slices start on 64-byte boundaries so threads
     * never share a cache line. */
    float *scratch;
    size_t scratch_stride;
    /* Attention's map from a flattened query row to its sequence: first row
     * of each sequence, [n_seqs + 1], grown like scratch. */
    int64_t *seq_row_start;
    int seq_row_cap;
    /* Attention's partial states when a call's chunks run as separate work
     * items (cpu_attention.c), grown like scratch. */
    float *attn_partial;
    size_t attn_partial_cap; /* floats */
    /* The allocations that are mappings of their own (cpu_alloc). */
    cpu_map *maps;
    int n_maps, maps_cap;
} cpu_ctx;

static inline cpu_ctx *cpu_ctx_of(cairn_backend *be)
{
    return (cpu_ctx *)be->ctx;
}

/* Make every thread's scratch slice hold at least `floats` floats.
 * CAIRN_ENOMEM (scratch unchanged) on failure. */
int cpu_scratch_reserve(cpu_ctx *ctx, size_t floats);

static inline float *cpu_scratch_of(cpu_ctx *ctx, int thread)
{
    return ctx->scratch + (size_t)thread * ctx->scratch_stride;
}

/* ---- ops (implemented in cpu_matmul.c, cpu_ops.c, cpu_attention.c) ----- */

int cpu_get_rows(cairn_backend *be, float *out, const void *table, cairn_type type, int D,
                 const int32_t *ids, int T);
int cpu_matmul(cairn_backend *be, float *y, const void *W, cairn_type wtype, const float *x,
               int T, int n_in, int n_out);
int cpu_matmul_multi(cairn_backend *be, const float *x, int T, int n_in, int n,
                     const cairn_matmul_part *parts);
int cpu_rmsnorm(cairn_backend *be, float *out, const float *x, const float *w, int T, int D,
                float eps);
int cpu_rope(cairn_backend *be, float *x, int T, int n_heads, int head_dim, const int32_t *pos,
             const cairn_rope_params *p);
int cpu_swiglu(cairn_backend *be, float *out, const float *gate, const float *up, size_t n);
int cpu_geglu(cairn_backend *be, float *out, const float *gate, const float *up, size_t n);
int cpu_swiglu_clamped(cairn_backend *be, float *out, const float *gate, const float *up,
                       size_t n, float alpha, float limit);
int cpu_scale(cairn_backend *be, float *x, float s, size_t n);
int cpu_gather_cols(cairn_backend *be, float *out, const float *x, const int32_t *idx, int T,
                    int n);
int cpu_add(cairn_backend *be, float *y, const float *a, const float *b, size_t n);
int cpu_add_bias(cairn_backend *be, float *x, const float *bias, int T, int n);
int cpu_add_rows_scaled(cairn_backend *be, float *y, const float *src, const int32_t *rows,
                        const float *w, int n, int D);
int cpu_softmax(cairn_backend *be, float *x, int T, int n);
int cpu_kv_store(cairn_backend *be, void *kv_pool, const cairn_kv_layout *L, int layer,
                 const float *k, const float *v, const int32_t *slots, int T);
int cpu_attention(cairn_backend *be, const cairn_attn_args *args);

/* ---- shared helpers ---------------------------------------------------- */

/* True when the kernels can multiply or look up rows of `type`
 * (F32, F16, BF16, F8_E4M3, Q8_0, Q4_0, Q5_0, Q4_Z, MXFP4, Q4_K, Q5_K,
 * Q6_K); also the backend's supports_type slot. */
int cpu_type_supported(cairn_type type);

/* True for the weight types multiplied against int8-quantized activations
 * (unless the backend is exact). Every one of them splits a row into
 * 32-element blocks (sub-blocks for the K-quants) that line up with the
 * activation blocks (scale d_a, codes q_a, code sum s_a). Every kernel and
 * the scalar reference (cpu_matmul.c) compute an output as one float
 * accumulator `acc`, starting at 0, updated per block b in block order by
 * exactly these operations (fma: one rounding; I, I_lo, I_hi: exact integer
 * sums; products in brackets rounded once, d and dmin exact as floats):
 *   Q8_0, Q4_0, Q5_0  acc = fma(I, [d_w d_a], acc),  I = sum_i (c_i - Z) q_a[i]
 *                     (Z = 0 for Q8_0's signed codes, 8, 16)
 *   Q4_Z              the same with Z = z, the block's own u8
 *   MXFP4             the same with Z = 12, c_i = 2 E2M1(nibble) + 12 in
 *                     [0, 24] and d_w = 2^(e - 128) (cpu_mxfp4_scale; exact,
 *                     a subnormal for e <= 1): w_i = d_w (c_i - 12) exactly
 *   Q4_K, Q5_K        acc = fma(I, [[d sc_j] d_a], acc);
 *                     acc = fma([dmin m_j], [-d_a s_a], acc),  I = sum_i c_i q_a[i]
 *   Q6_K              acc = fma(I_lo, [[d sc_2j] d_a], acc);
 *                     acc = fma(I_hi, [[d sc_2j+1] d_a], acc),
 *                     I_lo = sum_{i<16} (c_i - 32) q_a[i], I_hi the rest
 * so the AVX-512 kernels, the AVX2 kernels and the scalar reference agree
 * bit for bit, whatever the batch, tile or thread split. */
int cpu_q8act_type(cairn_type type);

/* The 8 six-bit scales and mins of a Q4_K/Q5_K super-block (12 packed
 * bytes; layout in common/common.h). */
static inline void cpu_kq_scales(const uint8_t *packed, uint8_t sc[8], uint8_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = packed[j] & 63;
        mn[j] = packed[j + 4] & 63;
        sc[j + 4] = (uint8_t)((packed[j + 8] & 0x0f) | ((packed[j] >> 6) << 4));
        mn[j + 4] = (uint8_t)((packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4));
    }
}

/* MXFP4: the unsigned code of each E2M1 nibble, twice its value plus the
 * zero 12 (common/quant.c's MXFP4_TWICE + 12): 0..24, so a block is
 * d_w (c - 12) with integer codes like Q4_0's, and the vector kernels look
 * the codes up with one byte shuffle per 64 (the list is their table). */
#define CPU_MXFP4_ZERO 12
#define CPU_MXFP4_CODES 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0
static inline int cpu_mxfp4_code(unsigned nibble)
{
    static const uint8_t code[16] = {CPU_MXFP4_CODES};
    return code[nibble & 15];
}

/* An MXFP4 block's scale 2^(e - 128) (the E8M0 exponent's 2^(e - 127)
 * halved, since the codes are twice the E2M1 values), exact for all 256
 * values of e as float bits: (e - 1) << 23 for e >= 2 (exponent field
 * e - 1), the subnormals 2^-127 = 0x400000 and 2^-128 = 0x200000 for
 * e = 1 and 0. One signed max of two linear pieces gives all three cases:
 * (e + 1) << 21 is 0x200000, 0x400000 at e = 0, 1 and smaller than
 * (e - 1) << 23 from e = 2 on, where (e - 1) << 23 < 0 at e = 0. The
 * vector kernels compute the same integers, so every level has the same
 * float (and e = 255 is 2^127, as cairn_dequantize_row has it). */
static inline float cpu_mxfp4_scale(uint8_t e)
{
    const int32_t a = ((int32_t)e - 1) * (1 << 23), b = ((int32_t)e + 1) << 21;
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)(a > b ? a : b);
    return v.f;
}

/* Exact IEEE half -> float conversion (same values as cairn_fp16_to_fp32),
 * inline because attention converts every K and V element it reads. */
static inline float cpu_half_to_float(uint16_t h)
{
    union { uint32_t u; float f; } v;
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0) {
        /* zero or subnormal: mantissa * 2^-24, exact in float */
        v.f = (float)mantissa * 0x1p-24f;
        v.u |= sign;
    } else if (exponent == 31) {
        v.u = sign | 0x7f800000u | (mantissa << 13); /* inf or NaN */
    } else {
        v.u = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    return v.f;
}

/* Exact FP8 e4m3fn -> float (same values as cairn_e4m3_to_fp32), inline
 * for the F8_E4M3 weight kernels. The subnormal codes (exponent field 0)
 * are formed as m * 2^-9, a normal float, never as a float denormal, so
 * the result does not depend on denormals-are-zero; 0x7f/0xff are NaN. */
static inline float cpu_e4m3_to_float(uint8_t v)
{
    union { uint32_t u; float f; } r;
    const uint32_t em = v & 0x7fu;
    if (em < 8) {
        r.f = (float)em * 0x1p-9f;
    } else if (em == 0x7f) {
        r.u = 0x7fc00000u;
    } else {
        /* (1 + m/8) 2^(e-7): exponent field e + 120, m in the top 3 bits */
        r.u = (em << 20) + (120u << 23);
    }
    r.u |= (uint32_t)(v & 0x80u) << 24;
    return r.f;
}

/* ---- matmul kernels (cpu_x86*.c) ------------------------------------- */

/* One 32-element block of activations quantized to int8: d = max|x| / 127,
 * q = round(x / d), the sum of the codes (for the weights' zero-point
 * correction) and the sum of the first 16 (Q6_K's half blocks). Scalar
 * version, the reference for the vector ones. */
void cpu_quantize_act_block_ref(const float *x, int8_t *q, float *d, int32_t *sum,
                                int32_t *sum_lo);

/* Vector versions of the matmul pieces; each returns 0 when it cannot handle
 * the case (then the caller falls back to the next level). All of them
 * compute every output element with the same sequence of operations whatever
 * the row/token ranges and the tile an element falls in, so results do not
 * depend on the thread count. cpu_x86_quantize_act: the n / 32 blocks of x,
 * block b's codes at q + b q_stride and its d, s and s_lo at index b stride. */
int cpu_x86_quantize_act(cpu_isa isa, const float *x, int n, int8_t *q, size_t q_stride,
                         float *d, int32_t *s, int32_t *s_lo, size_t stride);

/* The quantized activations of one matmul call, in tiles of CPU_ACT_TILE
 * tokens so that a kernel reading up to 8 tokens of a tile follows one
 * stream with constant offsets: entry (t, b) — token t, block b — is
 *   e = (t / 8 * nb + b) * 8 + t % 8,   codes q[32 e .. 32 e + 32),
 * scale d[e], code sums s[e] and s_lo[e] (the first 16), and the weight
 * type's correction terms, computed once per call (cpu_matmul.c):
 *   zi[e]  Q8_0, Q4_0, Q5_0, MXFP4: -Z s;  Q4_Z: s (times the row's -z);
 *          Q6_K: -32 s_lo
 *   zi2[e] Q6_K: -32 (s - s_lo)
 *   zf[e]  Q4_K, Q5_K: [-d s] (the float of the min term)  */
#define CPU_ACT_TILE 8
typedef struct {
    const int8_t *q;
    const float *d;
    const int32_t *s, *s_lo, *zi, *zi2;
    const float *zf;
    int nb;
} cpu_act;

static inline size_t cpu_act_index(int nb, int t, int b)
{
    return ((size_t)(t / CPU_ACT_TILE) * (size_t)nb + (size_t)b) * CPU_ACT_TILE +
           (size_t)(t % CPU_ACT_TILE);
}

/* y[t][r] for r in [r0, r1), t in [0, T): float weights (F32, F16, BF16,
 * F8_E4M3) against float x, dot-product form; every element's arithmetic is
 * the same for any T, so a token's result does not depend on its batch. */
int cpu_x86_matmul_float(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                         size_t row_bytes, const float *x, int T, int n_in, int n_out, int64_t r0,
                         int64_t r1, float *panel);
/* Per-thread scratch (floats) the float kernel needs as `panel` for a batch
 * of T tokens of `wtype` weights (converted to F32 a panel at a time), and the rows per
 * work item it wants (its panel height, so items never split a panel). */
size_t cpu_x86_float_panel_floats(cpu_isa isa, cairn_type wtype, int T, int n_in);
int cpu_x86_float_rows_per_item(cpu_isa isa, int T);

/* ---- packed weights (cpu_pack.c, kernels in cpu_x86_quant.c) ---------
 *
 * Decode reads every weight byte once per token, so the weights' layout
 * sets its speed. In GGUF's a row is contiguous, and a kernel that forms
 * 16 outputs at once must follow 16 streams `row_bytes` apart and gather
 * each block's scale from each of them. The quantized types are therefore
 * repacked at load (the upload_weight slot, cpu_upload_weight) into groups
 * of CPU_PACK_ROWS = 16 rows, each one contiguous stream that holds, block
 * by block, the codes of the 16 rows side by side as the outer-product
 * kernels consume them:
 *
 *   matrix  | group 0: rows 0-15 | group 1: rows 16-31 | ... |   (rows past
 *             n_out are zero rows; group_bytes each, a multiple of 64)
 *   group   | main[0] | main[1] | ... | main[nsb-1] | side[0] | ... | pad |
 *             (one main and one side region per super-block: 32 elements,
 *             or 256 for the K-quants)
 *
 * A "column vector" is 64 bytes whose dword i is 4 consecutive bytes of
 * row i; vector k of a run takes GGUF bytes 4k..4k+3 of the super-block.
 * Per super-block (offsets in bytes, rows in lanes, f16 scales as 16
 * consecutive halves):
 *
 *   Q8_0  main 512: 8 vectors of the codes, each byte XOR 0x80 (unsigned
 *                   c + 128)                      side 32: d
 *   Q4_0  main 256: 4 vectors of the 16 nibble bytes          side 32: d
 *   Q5_0  main 320: Q4_0's 4 vectors, then 8 u64 masks: mask m, bit 4i + e
 *                   = bit 4m + e of row i's qh (the fifth bit of the code
 *                   in byte e, lane i of the low (m < 4) or high (m >= 4)
 *                   nibbles of vector m % 4)      side 32: d
 *   Q4_Z  main 256: as Q4_0                       side 48: d, then z (u8)
 *   MXFP4 main 256: as Q4_0 (the E2M1 nibbles)    side 16: e (the E8M0
 *                   byte of each row; decode reads every weight byte, so
 *                   the scale stays 1 byte rather than a 4-byte float:
 *                   17 bytes a row and block, as in GGUF)
 *   Q4_K  main 2304: 32 vectors of qs (pair p = blocks 2p, 2p+1 at 512 p),
 *                   d, dmin, 3 vectors of the 12 scale bytes   side 0
 *   Q5_K  main 2816: 32 vectors of qs, 8 of qh, d, dmin, 3 of scales
 *   Q6_K  main 3328: 32 vectors of ql (chunk c = bytes 32c.. at 512 c), 16
 *                   of qh (chunk h at 2048 + 512 h), the 16 int8 scales as
 *                   16 columns of a byte per row (scale k at 3072 + 16 k)
 *                                                 side 32: d
 *   F16, BF16 (packed only where the AVX-512 kernels run) main 1024 per 32
 *                   elements: 16 vectors, vector p = elements 2p, 2p+1
 *
 * Packing moves bytes and nothing else (Q4_Z's pad byte is dropped, and
 * reads back as 0), so cpu_unpack_row restores a GGUF row exactly:
 * get_rows and the scalar level read packed weights through it. Sizes
 * stay GGUF's (Q4_0: 288 bytes = 16 rows x 18 per block) up to the
 * padding of the last group and the 64-byte rounding. */
#define CPU_PACK_ROWS 16

typedef struct {
    cairn_type type;     /* the GGUF type (Q8_0, Q4_0, Q5_0, Q4_Z, MXFP4, Q4_K,
                            Q5_K, Q6_K, and F16/BF16)                       */
    int sb_elems;        /* elements per super-block: 32, or 256 (K-quants)  */
    int nsb;             /* super-blocks per row                              */
    size_t main_bytes;   /* main region of a super-block of a group           */
    size_t side_bytes;   /* its side region                                   */
    size_t side_off;     /* offset of the side regions in a group             */
    size_t group_bytes;  /* bytes of one group of 16 rows                     */
    size_t row_bytes;    /* bytes of one GGUF row                             */
} cpu_pack_geom;

/* The geometry of `type` with n_in columns: 1, or 0 when the type has no
 * packed layout or n_in is not a whole number of super-blocks. */
int cpu_pack_geom_init(cpu_pack_geom *g, cairn_type type, int n_in);
/* Bytes of a packed [n_out][n_in] matrix; 0 when it cannot be packed. */
size_t cpu_packed_bytes(cairn_type type, int n_in, int n_out);
/* Pack `rows` (<= 16) GGUF rows, row i at src + i * row_stride, into one
 * group of g->group_bytes (64-byte aligned); the rest are zero rows. */
void cpu_pack_group(const cpu_pack_geom *g, const uint8_t *src, size_t row_stride, int rows,
                    uint8_t *group);
/* Row `lane` of a packed group back in GGUF layout (g->row_bytes). */
void cpu_unpack_row(const cpu_pack_geom *g, const uint8_t *group, int lane, uint8_t *row);

/* A packed weight's type as matmul and get_rows take it, and back. */
static inline cairn_type cpu_packed_type(cairn_type t)
{
    return (cairn_type)((int)t | CAIRN_TYPE_PACKED);
}
static inline int cpu_is_packed(cairn_type t)
{
    return ((int)t & CAIRN_TYPE_PACKED) != 0;
}
static inline cairn_type cpu_unpacked_type(cairn_type t)
{
    return (cairn_type)((int)t & ~CAIRN_TYPE_PACKED);
}

/* y[t][0 .. rows) from packed F16/BF16 groups (cpu_x86_float.c states the
 * arithmetic): with xb [T][n_in] (BF16 weights only) the bf16 dot products
 * against those activations, else float FMAs against x [T][n_in]. 0 when
 * the level has no kernel. */
int cpu_x86_gemm_float_groups(cpu_isa isa, cairn_type wtype, size_t group_bytes,
                              const uint8_t *grp, int rows, const float *x, const uint16_t *xb,
                              int T, int n_in, float *y, int n_out, const cpu_quant_tuning *tune);
/* x[n] to bf16, rounding to nearest even (AVX512_BF16; 0 without it). */
int cpu_x86_to_bf16(const float *x, uint16_t *out, size_t n);

/* The weight_layout and upload_weight slots (kernels/backend.h). */
int cpu_weight_layout(const cairn_backend *be, cairn_type type, int n_in, int n_out,
                      size_t *bytes, cairn_type *as);
int cpu_upload_weight(cairn_backend *be, void *dst, const void *host_src, cairn_type type,
                      int n_in, int n_out);


/* y[t][0 .. rows) for t in [0, T) (y rows n_out apart) from the packed
 * groups at grp (ceil(rows / 16) of them, group_bytes apart) against the
 * quantized activations `act` (with the corrections of g->type). 0 when
 * the level has no kernel. */
int cpu_x86_gemm_groups(cpu_isa isa, const cpu_pack_geom *g, const uint8_t *grp, int rows,
                        const cpu_act *act, int T, int n_in, float *y, int n_out,
                        const cpu_quant_tuning *tune);

/* ---- attention helpers (cpu_x86_attention.c) -------------------------- */

/* q · k for a float query and a K row of `dtype` (F32/F16), and
 * acc += w * v; vector versions, 0 when the level has none. */
typedef float (*cpu_dot_kv_fn)(const float *q, const void *k, int n);
typedef void (*cpu_axpy_kv_fn)(float *acc, float w, const void *v, int n);
cpu_dot_kv_fn cpu_x86_dot_kv(cpu_isa isa, cairn_type dtype);
cpu_axpy_kv_fn cpu_x86_axpy_kv(cpu_isa isa, cairn_type dtype);

/* The vector attention kernel: flash-style, one pass over the keys with a
 * running maximum, in tiles and chunks at fixed absolute key positions.
 *
 *   keys  0        512       1024              n_scan
 *         |tile|tile|...     |                   |      tile  = 16 keys
 *         |---- chunk 0 -----|---- chunk 1 ----|-|      chunk = 512 keys
 *
 * A work item is the query vectors of n_rows consecutive rows of one
 * sequence times the `group` query heads that share one KV head (a prefill
 * block, or one decode row). Each K/V tile is converted to F32 once per item
 * and used by every vector of it, so a long prefill reads its KV once per
 * block of rows instead of once per row. Within a chunk each vector keeps
 * (m, l, acc): the largest score so far, the sum of exp(s - m), and the
 * weighted sum of V rows, rescaled when m grows. A chunk starts afresh;
 * chunks are folded in key order by the driver (cpu_attention.c).
 *
 * Why this shape: a vector's arithmetic depends only on its query, its keys
 * and these fixed boundaries — never on which rows share its item, on the
 * thread count, or on whether its chunks ran in one item (prefill) or as
 * items of their own folded afterwards (decode at long context, where one
 * row per sequence would otherwise leave threads idle). So the same request
 * gives the same bits whatever batch, chunking or thread count it runs in. */
enum { CPU_ATTN_TILE = 16, CPU_ATTN_CHUNK = 512 };
/* Most lane groups in one item (rows_per_item in cpu_attention.c keeps
 * items at 64 vectors, 128 at most): a bound for the kernel's stack tables. */
enum { CPU_ATTN_LANE_GROUPS_MAX = 16 };

typedef struct {
    const cairn_kv_layout *L;
    const uint8_t *pool;
    int layer;
    size_t head_off;        /* byte offset of the KV head inside a row         */
    const int32_t *pages;   /* the sequence's page table                        */
    float scale;
    int group;              /* query heads per KV head                          */
    int n_rows;             /* query rows in the item                           */
    const float *q;         /* row r, head h of the group: q + r * row_stride
                               + h * head_dim                                   */
    size_t row_stride;      /* floats from one query row to the next            */
    const int32_t *n_scan;  /* [n_rows] keys 0 .. n_scan[r]-1 may be visible    */
    const int32_t *n_skip;  /* [n_rows] keys below n_skip[r] are not: outside a
                               sliding window (0 without one). A tile no lane
                               of a group sees leaves its state as it was, bit
                               for bit, so skipping it changes nothing.        */
    const uint8_t *mask;    /* [n_rows][mask_stride], 1 = visible, or NULL      */
    size_t mask_stride;
    float *kv_tile;         /* scratch, 64-byte aligned: 2 * 16 * head_dim      */
    float *q_t;             /* scratch, 64-byte aligned: lane groups * 16 * hd  */
} cpu_attn_item;

/* Vectors are kept 16 to a lane group (vector v = r * group + h in group
 * v / 16, lane v % 16). A group's partial state, cpu_attn_state_floats
 * floats: acc[head_dim][16], then m[16] (largest score) and l[16] (sum of
 * weights). */
static inline size_t cpu_attn_state_floats(int head_dim)
{
    return ((size_t)head_dim + 2) * 16;
}
/* n_groups lane-group states with nothing seen yet: acc = 0, m = -inf, l = 0. */
static inline void cpu_attn_state_clear(float *st, int n_groups, int head_dim)
{
    const size_t stride = cpu_attn_state_floats(head_dim);
    for (int g = 0; g < n_groups; g++, st += stride) {
        memset(st, 0, sizeof(float) * (size_t)head_dim * 16);
        for (int lane = 0; lane < 16; lane++) {
            st[(size_t)head_dim * 16 + lane] = -INFINITY; /* m */
            st[(size_t)head_dim * 16 + 16 + lane] = 0.0f; /* l */
        }
    }
}
static inline int cpu_attn_lane_groups(int n_vectors)
{
    return (n_vectors + 15) / 16;
}
/* The partial states of every lane group of the item over the keys
 * [chunk * CPU_ATTN_CHUNK, (chunk + 1) * CPU_ATTN_CHUNK) it may see, into
 * partial[lane groups][cpu_attn_state_floats]: written from scratch; a lane
 * the chunk shows nothing keeps m = -inf, l = 0, acc = 0. */
typedef void (*cpu_attend_chunk_fn)(const cpu_attn_item *it, int chunk, float *partial);
/* NULL when the level or the shape (head_dim not a multiple of 16, or over
 * 256, or a KV type other than F16/F32) has no such kernel. */
cpu_attend_chunk_fn cpu_x86_attend_chunk(cpu_isa isa, const cairn_kv_layout *L);

/* ---- element-wise helpers (cpu_x86_attention.c) ----------------------- */

/* n floats to F16, exactly as cairn_fp32_to_fp16 rounds them (NaNs become
 * its canonical quiet NaN); 0 when the level has no vector version. */
int cpu_x86_f32_to_f16(cpu_isa isa, uint16_t *dst, const float *src, int n);
/* out[i] = g[i] / (1 + e^-g[i]) * u[i] with a vector exponential (within
 * 2 ulp of expf); out may alias g or u. 0 when the level has none. */
int cpu_x86_swiglu(cpu_isa isa, float *out, const float *g, const float *u, int64_t n);

/* Single-precision dot product of two float vectors of length n. Uses a fixed
 * number of partial sums, so the result depends only on the inputs. */
float cpu_dot_f32(const float *a, const float *b, int64_t n);

#endif /* CAIRN_KERNELS_CPU_IMPL_H */
