/*
 * kernels/cuda/cuda_impl.h — internals of the CUDA backend, shared by the
 * .cu files of kernels/cuda/ and included by nothing else (it needs nvcc).
 *
 * Structure
 * ---------
 *   cuda_backend.cu    create/destroy, device memory, the staging ring for
 *                      host index arrays, the function table
 *   cuda_ops.cu        get_rows, rmsnorm, rope, swiglu, swiglu_clamped, geglu,
 *                      scale, gather_cols, add, add_bias,
 *                      add_rows_scaled, softmax, kv_store
 *   cuda_matmul.cu     matmul: cuBLAS for F32 and (prefill) F16/BF16,
 *                      warp-per-row GEMV kernels for decode, dequantize +
 *                      SGEMM for quantized prefill
 *   cuda_attention.cu  attention over the paged KV pool
 *   cuda_transfer.cu   page transfers on a copy stream, fences, pinned
 *                      host memory, device memory figures
 *   cuda_graph.cu      a decode step captured and launched as one graph
 *   cuda_sample.cu     sample_rows: tokens drawn on the device
 *
 * Execution model: every op is enqueued on the one stream the backend owns
 * and returns without waiting; download() and synchronize() wait. Host index
 * arrays (token ids, positions, slots, page tables, masks) are copied into a
 * pinned "staging ring" and sent to a device mirror of it with an async
 * copy on the same stream, so the kernel that reads them is ordered after
 * the copy. A ring region is only reused after the stream has drained
 * (cuda_stage_reserve synchronizes when it wraps), so no copy still in
 * flight can see its source overwritten.
 *
 * Float semantics: where the CPU backend fixes an expression (dequantizers,
 * RMSNorm's double sum, RoPE's running angle product), the kernels use the
 * same one with explicit round-to-nearest intrinsics (__fmul_rn, ...) so
 * that nvcc cannot contract it into an FMA and results stay bit-identical
 * to the CPU's where the tests expect that.
 */
#ifndef CAIRN_KERNELS_CUDA_IMPL_H
#define CAIRN_KERNELS_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_stage_table.h"

/* The copy stream and fences of page transfers (cuda_transfer.cu). */
typedef struct cuda_transfers cuda_transfers;
/* Decode steps captured as graphs (cuda_graph.cu). */
typedef struct cuda_graphs cuda_graphs;

typedef struct {
    int device;
    cudaStream_t stream;   /* every op and copy runs on it, in order      */
    cublasHandle_t cublas; /* bound to `stream`                          */
    /* Staging ring: pinned host bytes and their device mirror, same size. */
    uint8_t *stage_host;
    uint8_t *stage_dev;
    size_t stage_cap, stage_used;
    /* Regions sent in this epoch of the ring (it ends when the ring wraps
     * or grows, and at each step graph's start), so identical arrays are
     * sent once: every layer of a step stages the same positions, slots and
     * page tables. */
    cuda_stage_table stage_sent;
    /* Device scratch for matmul (activations converted to 16 bits, or a
     * chunk of dequantized weight rows); grown, never shrunk. */
    void *scratch;
    size_t scratch_cap;
    char name[256]; /* the device name, for logs */
    cuda_transfers *xfer; /* NULL until the first transfer */
    cuda_graphs *graphs;  /* NULL: steps run eagerly (CAIRN_CUDA_GRAPHS unset) */
} cuda_ctx;

static inline cuda_ctx *cuda_ctx_of(cairn_backend *be)
{
    return (cuda_ctx *)be->ctx;
}

/* Log a failed CUDA runtime call and turn it into CAIRN_EBACKEND. */
int cuda_fail(const char *what, cudaError_t err);
#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return cuda_fail(#call, e_);                                                           \
    } while (0)
/* After a kernel launch: a bad launch configuration shows up here. With
 * CAIRN_CUDA_SYNC=1 in the environment (read at backend creation) it also
 * waits for the kernel, so a fault inside it is reported with the op's
 * name instead of at the next download. */
int cuda_launched(const char *what);
#define CUDA_LAUNCHED(what)                                                                        \
    do {                                                                                           \
        int rc_ = cuda_launched(what);                                                             \
        if (rc_ != CAIRN_OK)                                                                       \
            return rc_;                                                                            \
    } while (0)

/* cuBLAS, loaded with dlopen by the first cairn_backend_cuda_create rather
 * than linked: linking it would map cuBLAS and cuBLASLt (~600 MB) into every
 * cairn process, GPU or not, and page in ~100 MB of them at start-up. The
 * pointers have the exact types of the cublas_v2.h functions. */
/* cublasGemmEx is overloaded in C++ (a legacy inline form): spell the type
 * out, and let the decltype below check it against the real declaration. */
typedef cublasStatus_t (*cuda_gemm_ex_fn)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                          int, int, int, const void *, const void *, cudaDataType,
                                          int, const void *, cudaDataType, int, const void *,
                                          void *, cudaDataType, int, cublasComputeType_t,
                                          cublasGemmAlgo_t);
typedef decltype(static_cast<cuda_gemm_ex_fn>(&cublasGemmEx)) cuda_gemm_ex_checked;
typedef struct {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasDestroy_v2) destroy;
    decltype(&cublasSetStream_v2) set_stream;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm_v2) sgemm;
    cuda_gemm_ex_checked gemm_ex;
    decltype(&cublasSetWorkspace_v2) set_workspace; /* NULL when absent (graphs stay off) */
} cuda_blas_api;
extern cuda_blas_api cuda_blas;
/* Load it once (thread-safe); CAIRN_EUNSUPPORTED, logged, when the library
 * or one of its functions cannot be found. */
int cuda_blas_load(void);

/* Make the backend's device current on the calling thread (cheap when it
 * already is); every entry point calls it first. */
int cuda_enter(cairn_backend *be);

/* Reserve `bytes` (rounded up to 16) of the staging ring: *host is where the
 * caller writes, *dev the device address the same bytes will have once
 * cuda_stage_send() has been called. Synchronizes the stream when the ring
 * wraps, and grows the ring when one request is larger than it. */
int cuda_stage_reserve(cuda_ctx *ctx, size_t bytes, uint8_t **host, uint8_t **dev);
/* At least `room` contiguous bytes free in the ring: when fewer are left
 * it wraps (waits for the stream and starts over), or grows when it is
 * smaller than `room`. cuda_stage_reserve's first step; a graph capture
 * calls it beforehand, since it may not wait inside. */
int cuda_stage_room(cuda_ctx *ctx, size_t room);
/* CAIRN_CUDA_SYNC=1: every kernel is waited for (no graphs then). */
int cuda_debug_sync(void);
/* Enqueue the copy of a reserved region to the device. */
int cuda_stage_send(cuda_ctx *ctx, uint8_t *host, uint8_t *dev, size_t bytes);
/* Send a region just reserved and filled — unless the same bytes went to
 * the device earlier in this epoch of the ring: then the region is given
 * back and *dev becomes the earlier copy (ordered before every later op on
 * the stream, and untouched until the ring wraps). */
int cuda_stage_commit(cuda_ctx *ctx, uint8_t *host, uint8_t **dev, size_t bytes);
/* Both at once for one host array: *dev receives its device copy. */
int cuda_stage_copy(cuda_ctx *ctx, const void *src, size_t bytes, const void **dev);

/* Device scratch of at least `bytes`, valid until the next call. */
int cuda_scratch_reserve(cuda_ctx *ctx, size_t bytes, void **out);

/* ---- transfers (cuda_transfer.cu) ----------------------------------------- */

/* Set graph_begin and graph_end; make (with CAIRN_CUDA_GRAPHS=1) or free
 * what they keep. */
void cuda_graph_iface(cairn_backend_iface *t);
int cuda_graphs_init(cuda_ctx *ctx);
void cuda_graphs_free(cuda_ctx *ctx);

/* Set host_alloc, host_free, transfer, fence_wait and memory_info. */
void cuda_transfer_iface(cairn_backend_iface *t);
/* Wait for and free the copy stream and its events (destroy, before the
 * compute stream goes). */
void cuda_transfers_free(cuda_ctx *ctx);

/* ---- ops ---------------------------------------------------------------- */

int cuda_get_rows(cairn_backend *be, float *out, const void *table, cairn_type type, int D,
                  const int32_t *ids, int T);
int cuda_matmul(cairn_backend *be, float *y, const void *W, cairn_type wtype, const float *x, int T,
                int n_in, int n_out);
int cuda_matmul_invariant_rows(const cairn_backend *be, cairn_type wtype);
int cuda_rmsnorm(cairn_backend *be, float *out, const float *x, const float *w, int T, int D,
                 float eps);
int cuda_rope(cairn_backend *be, float *x, int T, int n_heads, int head_dim, const int32_t *pos,
              const cairn_rope_params *p);
int cuda_swiglu(cairn_backend *be, float *out, const float *gate, const float *up, size_t n);
int cuda_geglu(cairn_backend *be, float *out, const float *gate, const float *up, size_t n);
int cuda_swiglu_clamped(cairn_backend *be, float *out, const float *gate, const float *up,
                        size_t n, float alpha, float limit);
int cuda_gather_cols(cairn_backend *be, float *out, const float *x, const int32_t *idx, int T,
                     int n);
int cuda_scale(cairn_backend *be, float *x, float s, size_t n);
int cuda_add(cairn_backend *be, float *y, const float *a, const float *b, size_t n);
int cuda_add_bias(cairn_backend *be, float *x, const float *bias, int T, int n);
int cuda_add_rows_scaled(cairn_backend *be, float *y, const float *src, const int32_t *rows,
                         const float *w, int n, int D);
int cuda_softmax(cairn_backend *be, float *x, int T, int n);
int cuda_kv_store(cairn_backend *be, void *kv_pool, const cairn_kv_layout *L, int layer,
                  const float *k, const float *v, const int32_t *slots, int T);
int cuda_attention(cairn_backend *be, const cairn_attn_args *args);
/* The sample_rows slot (cuda_sample.cu). */
int cuda_sample_rows(cairn_backend *be, const float *logits, int n_rows, int n_vocab,
                     const cairn_sample_row *rows, int32_t *tokens, cairn_sample_logprob *lp);

/* ---- shared helpers ------------------------------------------------------ */

/* The weight/table types the kernels read: F32, F16, BF16, Q8_0, Q4_0, Q5_0,
 * Q4_K, Q5_K, Q6_K, and cairn's checkpoint layouts Q4_Z and F8_E4M3 (the
 * CPU backend's set); also the backend's supports_type slot. */
int cuda_type_supported(cairn_type type);
/* Bytes of a row of n elements, 0 when n is not whole blocks. */
size_t cuda_row_bytes(cairn_type type, int64_t n);

/* ---- device-side dequantization (layouts in common/common.h) ------------- */

__device__ __forceinline__ float cu_half_at(const uint8_t *p)
{
    /* byte reads: quantized blocks are only 2-byte aligned (34, 18, 22, 210) */
    const unsigned short h = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(h));
}

/* Bytes [0, 4 NW) of p as little-endian words. Q4_Z and F8_E4M3 blocks are
 * 20 and 36 bytes, so in a 4-byte aligned row (every weight the backend
 * allocates) each block is 4-byte aligned too: then one 32-bit load per
 * word instead of four byte loads. Rows are whole words long, so the test
 * comes out the same for every block of a matrix and no warp diverges on
 * it. */
template <int NW> __device__ __forceinline__ void cu_words_at(const uint8_t *p, unsigned *w)
{
    if (((uintptr_t)p & 3u) == 0) {
#pragma unroll
        for (int k = 0; k < NW; k++)
            w[k] = ((const unsigned *)p)[k];
    } else {
#pragma unroll
        for (int k = 0; k < NW; k++)
            w[k] = (unsigned)p[4 * k] | ((unsigned)p[4 * k + 1] << 8) |
                   ((unsigned)p[4 * k + 2] << 16) | ((unsigned)p[4 * k + 3] << 24);
    }
}

/* FP8 e4m3fn code (the low 8 bits of v) to float: cairn_e4m3_to_fp32's
 * value, assembled from bits so that nothing depends on how denormals are
 * treated (-ftz, or a future flag change): every e4m3 value is a normal
 * float (the smallest, 2^-9, is far above float's 2^-126).
 *   e != 0:    (1 + m/8) 2^(e-7): exponent field e + 120, mantissa m << 20
 *   e == 0:    m 2^-9 = (1 + m/8) 2^-6 - 2^-6, the code read as if e were
 *              1 minus 2^-6: an exact subtraction of normal floats, +0 for
 *              m = 0 (and no int-to-float conversion, a slow instruction)
 *   0x7f/0xff: NaN (the CPU's NAN and -NAN)
 * and the sign bit goes to bit 31. */
__device__ __forceinline__ float cu_e4m3_to_float(unsigned v)
{
    const unsigned a = v & 0x7fu; /* e:m, the magnitude's 7 bits */
    const unsigned bits = (a << 20) + (120u << 23);
    float x = __uint_as_float(bits);
    if (a < 8u)
        x = __fsub_rn(__uint_as_float(bits + (1u << 23)), 0x1p-6f);
    if (a == 0x7fu)
        x = __uint_as_float(0x7fc00000u);
    return __uint_as_float(__float_as_uint(x) | ((v & 0x80u) << 24));
}

/* 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block. */
__device__ __forceinline__ void cu_kq_scale_min(const uint8_t *p, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = p[j] & 63;
        *mn = p[j + 4] & 63;
    } else {
        *sc = (p[j + 4] & 0x0f) | ((p[j - 4] >> 6) << 4);
        *mn = (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
    }
}

/* Elements [32b, 32b + 32) of a row of `type` into v[32], with exactly the
 * float expressions of cairn_dequantize_row. For the K-quants, b counts
 * 32-element sub-blocks. F32/F16/BF16 rows are read element-wise. */
/* Twice the value of an E2M1 nibble (MXFP4): sign bit 8, magnitudes
 * 0, .5, 1, 1.5, 2, 3, 4, 6 doubled to integers. */
__device__ __forceinline__ int cu_mxfp4_twice(unsigned nibble)
{
    const int m = (int)(nibble & 7u);
    const int mag = m < 5 ? m : m == 5 ? 6 : m == 6 ? 8 : 12;
    return (nibble & 8u) ? -mag : mag;
}

__device__ __forceinline__ void cu_dequant_block32(const uint8_t *row, int type, int b, float *v)
{
    switch (type) {
    case CAIRN_TYPE_F32: {
        const float *f = (const float *)row + 32 * (size_t)b;
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = f[j];
        return;
    }
    case CAIRN_TYPE_F16: {
        const __half *h = (const __half *)row + 32 * (size_t)b;
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = __half2float(h[j]);
        return;
    }
    case CAIRN_TYPE_BF16: {
        const unsigned short *h = (const unsigned short *)row + 32 * (size_t)b;
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = __uint_as_float((unsigned)h[j] << 16);
        return;
    }
    case CAIRN_TYPE_Q8_0: {
        const uint8_t *blk = row + 34 * (size_t)b;
        const float d = cu_half_at(blk);
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = __fmul_rn(d, (float)(int8_t)blk[2 + j]);
        return;
    }
    case CAIRN_TYPE_Q4_0: {
        const uint8_t *blk = row + 18 * (size_t)b;
        const float d = cu_half_at(blk);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = __fmul_rn(d, (float)((blk[2 + j] & 0x0f) - 8));
            v[j + 16] = __fmul_rn(d, (float)((blk[2 + j] >> 4) - 8));
        }
        return;
    }
    case CAIRN_TYPE_Q4_Z: {
        /* { f16 d; u8 z; u8 pad; u8 qs[16] }: word 0 holds d and z, words
         * 1..4 the nibbles, Q4_0's order (element j low nibble of byte j,
         * j + 16 its high nibble). (q - z) is an exact small integer. */
        unsigned w[5];
        cu_words_at<5>(row + 20 * (size_t)b, w);
        const float d = __half2float(__ushort_as_half((unsigned short)(w[0] & 0xffffu)));
        const int z = (int)((w[0] >> 16) & 0xffu);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = (int)((w[1 + j / 4] >> (8 * (j % 4))) & 0xffu);
            v[j] = __fmul_rn(d, (float)((q & 0x0f) - z));
            v[j + 16] = __fmul_rn(d, (float)((q >> 4) - z));
        }
        return;
    }
    case CAIRN_TYPE_F8_E4M3: {
        /* { f32 d; u8 q[32] }: word 0 is d's bits, words 1..8 the codes */
        unsigned w[9];
        cu_words_at<9>(row + 36 * (size_t)b, w);
        const float d = __uint_as_float(w[0]);
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = __fmul_rn(d, cu_e4m3_to_float(w[1 + j / 4] >> (8 * (j % 4))));
        return;
    }
    case CAIRN_TYPE_Q5_0: {
        const uint8_t *blk = row + 22 * (size_t)b;
        const float d = cu_half_at(blk);
        const unsigned qh = (unsigned)blk[2] | ((unsigned)blk[3] << 8) | ((unsigned)blk[4] << 16) |
                            ((unsigned)blk[5] << 24);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int lo = (blk[6 + j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
            const int hi = (blk[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            v[j] = __fmul_rn(d, (float)(lo - 16));
            v[j + 16] = __fmul_rn(d, (float)(hi - 16));
        }
        return;
    }
    case CAIRN_TYPE_MXFP4: {
        /* { u8 e; u8 qs[16] } (17 bytes: read a byte at a time), Q4_0's
         * nibble order; w = 2^(e - 128) * (twice the E2M1 value), both
         * exact in float: the scale is cpu_mxfp4_scale's float bits
         * ((e - 1) << 23, the subnormals 2^-127 and 2^-128 for e = 1, 0),
         * so every weight is the CPU's (cairn_dequantize_row's) value */
        const uint8_t *blk = row + 17 * (size_t)b;
        const int e = blk[0];
        const int a = (e - 1) * (1 << 23), c = (e + 1) << 21;
        const float d = __int_as_float(a > c ? a : c);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = __fmul_rn(d, (float)cu_mxfp4_twice(blk[1 + j] & 0x0f));
            v[j + 16] = __fmul_rn(d, (float)cu_mxfp4_twice(blk[1 + j] >> 4));
        }
        return;
    }
    case CAIRN_TYPE_Q4_K:
    case CAIRN_TYPE_Q5_K: {
        const int five = type == CAIRN_TYPE_Q5_K;
        const uint8_t *blk = row + (size_t)(b / 8) * (five ? 176 : 144);
        const int sub = b % 8;
        const float d = cu_half_at(blk), dmin = cu_half_at(blk + 2);
        int sc, mn;
        cu_kq_scale_min(blk + 4, sub, &sc, &mn);
        const float scale = __fmul_rn(d, (float)sc);
        const float offset = __fmul_rn(dmin, (float)mn);
        const uint8_t *qh = blk + 16;
        const uint8_t *nib = blk + (five ? 48 : 16) + 32 * (sub / 2);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (sub & 1) ? nib[l] >> 4 : nib[l] & 0x0f;
            if (five)
                q |= ((qh[l] >> sub) & 1) << 4;
            v[l] = __fsub_rn(__fmul_rn(scale, (float)q), offset);
        }
        return;
    }
    case CAIRN_TYPE_Q6_K: {
        const uint8_t *blk = row + (size_t)(b / 8) * 210;
        const int sub = b % 8, h = sub / 4, k = sub % 4;
        const float d = cu_half_at(blk + 208);
        const int8_t *scales = (const int8_t *)(blk + 192);
        const uint8_t *ql = blk + 64 * h + 32 * (k & 1), *qh = blk + 128 + 32 * h;
        /* the 32 elements of this quarter span two 16-element scale groups */
        const float s0 = __fmul_rn(d, (float)scales[2 * sub]);
        const float s1 = __fmul_rn(d, (float)scales[2 * sub + 1]);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int low = k < 2 ? ql[l] & 0x0f : ql[l] >> 4;
            const int q = low | (((qh[l] >> (2 * k)) & 3) << 4);
            v[l] = __fmul_rn(l < 16 ? s0 : s1, (float)(q - 32));
        }
        return;
    }
    default:
        /* unreachable: types are checked on the host */
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = 0.0f;
        return;
    }
}

/* ---- KV cache rows ("KV types" in kernels/backend.h) ---------------------- */

/* The kernels over KV pages are instantiated once per KV type: LAUNCH(KT)
 * runs with KT the compile-time constant of `dtype`. A dtype that is not a
 * KV type cannot pass the layout checks (cairn_kv_layout_valid), so the
 * default only guards. */
#define CUDA_KV_TYPE_DISPATCH(dtype, LAUNCH)                                                       \
    switch (dtype) {                                                                               \
    case CAIRN_TYPE_F32: LAUNCH(CAIRN_TYPE_F32); break;                                            \
    case CAIRN_TYPE_F16: LAUNCH(CAIRN_TYPE_F16); break;                                            \
    case CAIRN_TYPE_BF16: LAUNCH(CAIRN_TYPE_BF16); break;                                          \
    case CAIRN_TYPE_Q8_0: LAUNCH(CAIRN_TYPE_Q8_0); break;                                          \
    case CAIRN_TYPE_Q4_0: LAUNCH(CAIRN_TYPE_Q4_0); break;                                          \
    default: return CAIRN_EINVAL;                                                                  \
    }

/* Element d of one head's K or V row stored as KT, with the float
 * expressions of cairn_dequantize_row (so F32/F16 read exactly as before). */
template <int KT> __device__ __forceinline__ float cu_kv_elem(const uint8_t *head, int d)
{
    if (KT == CAIRN_TYPE_F32)
        return ((const float *)head)[d];
    if (KT == CAIRN_TYPE_F16)
        return __half2float(((const __half *)head)[d]);
    if (KT == CAIRN_TYPE_BF16)
        return __uint_as_float((unsigned)((const unsigned short *)head)[d] << 16);
    if (KT == CAIRN_TYPE_Q8_0) {
        const uint8_t *blk = head + 34 * (d >> 5);
        return __fmul_rn(cu_half_at(blk), (float)(int8_t)blk[2 + (d & 31)]);
    }
    /* Q4_0: elements 0..15 of a block in the low nibbles, 16..31 in the high */
    const uint8_t *blk = head + 18 * (d >> 5);
    const int e = d & 31;
    const int byte = blk[2 + (e & 15)];
    return __fmul_rn(cu_half_at(blk), (float)((e < 16 ? byte & 0x0f : byte >> 4) - 8));
}

/* In place, x[0 .. n) := H_R x on every run of R consecutive elements (R a
 * power of two dividing n; H_R orthonormal, so applying it twice gives x
 * back). Thread t of nt takes butterflies t, t + nt, ...; the caller's
 * threads must all call it, with x written and visible (a barrier before).
 * WARP: the callers are one warp (x private to it), else the whole block.
 * Ends with a barrier, so x can be read right after. */
template <bool WARP> __device__ __forceinline__ void cu_fwht_runs(float *x, int n, int R, int t, int nt)
{
    for (int len = 1; len < R; len <<= 1) {
        for (int p = t; p < n / 2; p += nt) {
            /* butterfly p pairs i and i + len inside a run of 2 * len */
            const int i = (p / len) * 2 * len + p % len;
            const float a = x[i], b = x[i + len];
            x[i] = a + b;
            x[i + len] = a - b;
        }
        if (WARP)
            __syncwarp();
        else
            __syncthreads();
    }
    const float s = 1.0f / sqrtf((float)R);
    for (int i = t; i < n; i += nt)
        x[i] *= s;
    if (WARP)
        __syncwarp();
    else
        __syncthreads();
}

#endif /* CAIRN_KERNELS_CUDA_IMPL_H */
