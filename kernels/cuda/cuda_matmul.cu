/*
 * kernels/cuda/cuda_matmul.cu — y[T][n_out] = x[T][n_in] · W[n_out][n_in]ᵀ
 * with W in GGUF block layout.
 *
 * Paths, chosen per call from the weight type and the number of tokens T:
 *
 *   F32, any T            cublasSgemm (full F32: the handle's math mode is
 *                         CUBLAS_DEFAULT_MATH, no TF32).
 *   F16/BF16, T <= 64     gemv16_kernel in groups of up to 8 tokens: a warp
 *                         per 1, 2 or 4 output rows, 8 weights per 16-byte
 *                         load, float activations, every weight byte read
 *                         once per group. Same float semantics as the CPU
 *                         (only the summation order differs).
 *   F16/BF16, T > 64      activations rounded to the weight's 16-bit type,
 *                         cublasGemmEx with F32 accumulation (tensor cores).
 *                         Relative error ~1e-2 against the CPU (the
 *                         activation rounding); the prefill path.
 *   quantized, T <= 64    (Q8_0, Q4_0, Q5_0, the K-quants, MXFP4, and the
 *                         checkpoint layouts Q4_Z and F8_E4M3)
 *                         gemv_block32_kernel, in groups of up to 8 tokens:
 *                         one warp per output row, a lane per 32-element
 *                         block dequantized on the fly with the CPU's exact
 *                         expressions (the CPU backend's "exact" semantics,
 *                         CAIRN_CPU_EXACT_MATMUL=1).
 *   quantized, T > 64     rows dequantized to F32 in chunks into scratch,
 *                         then cublasSgemm per chunk.
 *
 * Batch invariance (the rule docs/cuda.md states): on the two GEMV paths a
 * token's output is one fixed expression of its own activations and the
 * weights, whatever T, the group it falls in, or the rows per warp: each
 * lane runs an explicit __fmaf_rn chain over its blocks in a fixed order
 * and the warp sum is a fixed butterfly. No contraction is left to nvcc
 * (it could differ between template instantiations). So with 16-bit or
 * quantized weights a sequence decoded in a batch of up to 64 tokens gets
 * bit-identical logits to the same sequence decoded alone. The GEMV
 * reads the weights once per 8 tokens, so decode at batch 64 pays 8 weight
 * passes (the price of invariance; cuBLAS would read them once); F32
 * weights go to cuBLAS at every T and agree only to ~1e-6.
 *
 * Planned: FP8 prefill on Hopper tensor cores (not written: it needs a GPU
 * to be checked on). Today F8_E4M3 prefill is the quantized path above,
 * dequantize to F32 + SGEMM on CUDA cores. Two steps, the first for every
 * quantized type:
 *
 *   (a) dequantize to BF16 + cublasGemmEx. dequant_rows_kernel writes BF16
 *       (d * e4m3(q) in float as now, then __float2bfloat16_rn), the
 *       activations go through to_16bit_kernel, and the GEMM is
 *       matmul_gemm16's: CUDA_R_16BF A and B, CUBLAS_COMPUTE_32F, F32 out.
 *       No new library; the same 1e-2-relative tolerance as 16-bit prefill
 *       (the weights are rounded to BF16 too, unless d is a power of two).
 *   (b) FP8 through cuBLASLt (dlopen'ed like cuBLAS; cublasLtMatmul with
 *       CUBLAS_COMPUTE_32F, scale type CUDA_R_32F, A = W and B = x both
 *       CUDA_R_8F_E4M3, TRANSA = T and TRANSB = N, the only FP8 layout
 *       Hopper takes and the one this file already uses; D in F32, or BF16
 *       widened after; n_in a multiple of 16 and 16-byte aligned
 *       operands (T padded to 16 if the heuristic asks); a fixed 32 MiB
 *       workspace, so a graph can capture the call; an algorithm from
 *       cublasLtMatmulAlgoGetHeuristic, and (a) when it finds none).
 *       Scales: cuBLASLt's FP8 scales are a scalar per matrix
 *       (A_SCALE_POINTER) or, in cuBLAS 12.9 and later, an f32
 *       per row or column (A/B_SCALE_MODE = OUTER_VEC_32F) or per 1x128 /
 *       128x128 block (VEC128_32F, BLK128x128_32F; the modes sm_90 takes
 *       are for the heuristic to confirm on the GPU). A scale per 32
 *       elements along K (this layout's d; VEC32_UE8M0 is power-of-two
 *       and Blackwell-only) fits none of them, since it cannot be taken
 *       out of the tensor core's K sum. But the layout copies the
 *       checkpoint's scale into every block it covers, so a checkpoint
 *       scaled per tensor, per channel or per 128x128 block has one d per
 *       row or per 128x128 tile. So: a one-time repack per weight (a side
 *       buffer keyed by the weight pointer, or better a layout chosen when
 *       the weights are loaded) into the plain [n_out][n_in] e4m3 codes
 *       plus f32 scales, A in OUTER_VEC_32F (one d per row) or
 *       BLK128x128_32F; a weight whose d really varies every 32 elements
 *       (cairn's own quantizer, per-block amax) stays on (a). The
 *       activations are quantized per call to e4m3 with one f32 scale per
 *       token (B in OUTER_VEC_32F, or VEC128_32F per 1x128 for accuracy).
 *       That costs precision (e4m3 keeps 3 mantissa bits: up to 2^-4
 *       relative per activation), so the check against the CPU needs its
 *       own, wider tolerance, and the path should be opt-in at first.
 *
 *   Estimate, 4096 x 4096 F8_E4M3 weight, T = 512, H200 (4.8 TB/s; dense
 *   peaks ~67 TFLOPS F32, ~989 BF16, ~1979 FP8): 2 * 4096 * 4096 * 512 =
 *   17.2 GFLOP; weights 18.9 MB (36 bytes per 32), x 8.4 MB, y 8.4 MB (F32).
 *     now   dequantize writes 67 MB of F32, SGEMM reads it: ~170 MB
 *           (35 us) but 17.2 GFLOP on CUDA cores, ~0.3 ms: compute-bound.
 *     (a)   33.5 MB of BF16 written and read, x as BF16 4.2 MB: ~110 MB
 *           (23 us) and ~20 us of tensor-core time at ~800 TFLOPS; 155
 *           FLOP per byte against a ridge of ~206, so about balanced:
 *           ~50 us with the two conversion kernels, ~6x today.
 *     (b)   with the repack done at load: codes 16.8 MB, x quantized
 *           (8.4 MB read, 2.1 MB written), y 8.4 MB: ~38 MB (8 us) and
 *           ~10 us at ~1.5 PFLOPS; ~20 us with the activation kernel.
 *           Repacked per call instead it adds ~36 MB and one more kernel,
 *           and is memory-bound (the FP8 ridge is ~410 FLOP per byte).
 *   So (a) first (it helps Q4_Z and every quantized type too), (b) when a
 *   GPU run can measure it and check its accuracy.
 *
 * Row-major to cuBLAS: y (row-major [T][n_out]) is the column-major
 * n_out x T matrix C = Wᵀ·X where W's bytes, read column-major, are the
 * n_in x n_out matrix Wᵀ (so op(A) = A^T with lda = n_in) and x's are the
 * n_in x T matrix X (op(B) = B, ldb = n_in); ldc = n_out.
 */
#include "kernels/cuda/cuda_impl.h"

#define GEMV_MAX_T 8        /* tokens per GEMV launch (registers per lane)  */
#define GEMV_16_MAX_T 64    /* above this, 16-bit weights go to cuBLAS GemmEx */
#define GEMV_QUANT_MAX_T 64 /* above this, quantized weights go to SGEMM     */
#define GEMV_WARPS 4        /* output rows per block                         */
/* Dequantized-weight chunk for the quantized prefill path. */
#define DEQUANT_CHUNK_BYTES ((size_t)256 << 20)

static int cublas_status(const char *what, cublasStatus_t st)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return CAIRN_OK;
    cairn_log(CAIRN_LOG_ERROR, "cuda: %s failed: cuBLAS status %d", what, (int)st);
    return CAIRN_EBACKEND;
}

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- GEMV: any supported type, one lane per 32-element block ------------- */

static __global__ void gemv_block32_kernel(float *y, const uint8_t *W, int type, size_t row_bytes,
                                           const float *x, int T, int n_in, int n_out)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = blockIdx.x * GEMV_WARPS + warp;
    if (r >= n_out)
        return; /* the whole warp leaves together: r is per warp */
    const uint8_t *row = W + (size_t)r * row_bytes;
    float acc[GEMV_MAX_T];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_T; t++)
        acc[t] = 0.0f;
    const int nb = n_in / 32;
    float w[32];
    for (int b = lane; b < nb; b += 32) {
        cu_dequant_block32(row, type, b, w);
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++) {
            if (t < T) {
                const float *xb = x + (size_t)t * n_in + 32 * (size_t)b;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 32; j++)
                    s = __fmaf_rn(w[j], xb[j], s); /* explicit: see "Batch invariance" */
                acc[t] = __fadd_rn(acc[t], s);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < GEMV_MAX_T; t++) {
        if (t < T) {
            const float s = warp_sum(acc[t]);
            if (lane == 0)
                y[(size_t)t * n_out + r] = s;
        }
    }
}

/* ---- GEMV: F16/BF16 rows, 8 weights per 16-byte load ---------------------- */

/* Needs n_in % 8 == 0 and 16-byte aligned W and x (checked by the caller),
 * so that every row and every 8-element group starts 16-byte aligned.
 *
 * Each warp computes R consecutive output rows: per step a lane loads 16
 * bytes of each of the R rows and the matching 8 activations of each token
 * once, so the activations are re-read from L1 once per R rows rather than
 * once per row (with 8 tokens that traffic, not DRAM, would otherwise be
 * the limit). The expression for one (row, token) is the same for every R
 * and T, so a token's result does not depend on its batch. */
template <int R>
static __global__ void gemv16_kernel(float *y, const uint8_t *W, int bf16, const float *x, int T,
                                     int n_in, int n_out)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = (blockIdx.x * GEMV_WARPS + warp) * R;
    if (r0 >= n_out)
        return; /* the whole warp leaves together: r0 is per warp */
    const uint4 *rows[R];
#pragma unroll
    for (int i = 0; i < R; i++) /* rows past the end re-read row r0; never stored */
        rows[i] = (const uint4 *)(W + (size_t)(r0 + i < n_out ? r0 + i : r0) * n_in * 2);
    float acc[R][GEMV_MAX_T];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++)
            acc[i][t] = 0.0f;
    const int n8 = n_in / 8;
    for (int g = lane; g < n8; g += 32) {
        float w[R][8];
#pragma unroll
        for (int i = 0; i < R; i++) {
            const uint4 packed = rows[i][g]; /* consecutive lanes, consecutive 16 bytes */
            const unsigned words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const unsigned short lo = (unsigned short)(words[k] & 0xffffu);
                const unsigned short hi = (unsigned short)(words[k] >> 16);
                if (bf16) {
                    w[i][2 * k] = __uint_as_float((unsigned)lo << 16);
                    w[i][2 * k + 1] = __uint_as_float((unsigned)hi << 16);
                } else {
                    w[i][2 * k] = __half2float(__ushort_as_half(lo));
                    w[i][2 * k + 1] = __half2float(__ushort_as_half(hi));
                }
            }
        }
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++) {
            if (t < T) {
                const float4 *xv = (const float4 *)(x + (size_t)t * n_in) + 2 * (size_t)g;
                const float4 a = xv[0], b = xv[1];
#pragma unroll
                for (int i = 0; i < R; i++) {
                    /* one explicit fma chain, the same in every instantiation */
                    float s = acc[i][t];
                    s = __fmaf_rn(w[i][0], a.x, s);
                    s = __fmaf_rn(w[i][1], a.y, s);
                    s = __fmaf_rn(w[i][2], a.z, s);
                    s = __fmaf_rn(w[i][3], a.w, s);
                    s = __fmaf_rn(w[i][4], b.x, s);
                    s = __fmaf_rn(w[i][5], b.y, s);
                    s = __fmaf_rn(w[i][6], b.z, s);
                    s = __fmaf_rn(w[i][7], b.w, s);
                    acc[i][t] = s;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++) {
            if (t < T) {
                const float s = warp_sum(acc[i][t]);
                if (lane == 0 && r0 + i < n_out)
                    y[(size_t)t * n_out + r0 + i] = s;
            }
        }
    }
}

/* ---- conversions for the cuBLAS paths --------------------------------------- */

/* Activations to the weight's 16-bit type. A finite F16 value saturates at
 * ±65504 rather than becoming inf (an outlier activation would otherwise
 * poison the row with NaNs); NaN and ±inf pass through as themselves, so a
 * NaN propagates as on the CPU and the GEMV path (fminf/fmaxf alone would
 * turn it into -65504). BF16 has float's range. */
static __global__ void to_16bit_kernel(void *dst, const float *src, size_t n, int bf16)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = src[i];
        if (bf16)
            ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(v);
        else
            ((__half *)dst)[i] =
                __float2half_rn(isfinite(v) ? fminf(fmaxf(v, -65504.0f), 65504.0f) : v);
    }
}

/* Rows [0, rows) of a quantized matrix to F32, one 32-element block per
 * thread. */
static __global__ void dequant_rows_kernel(float *dst, const uint8_t *W, int type, size_t row_bytes,
                                           int n_in, int rows)
{
    const int nb = n_in / 32;
    const size_t total = (size_t)rows * nb;
    float v[32];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / nb;
        const int b = (int)(i % nb);
        cu_dequant_block32(W + r * row_bytes, type, b, v);
        float *out = dst + r * n_in + 32 * (size_t)b;
#pragma unroll
        for (int j = 0; j < 32; j++)
            out[j] = v[j];
    }
}

static unsigned grid_1d(size_t n, int threads)
{
    size_t blocks = (n + threads - 1) / threads;
    return (unsigned)(blocks > 65535 ? 65535 : blocks < 1 ? 1 : blocks);
}

/* ---- dispatch ---------------------------------------------------------------- */

static int sgemm(cuda_ctx *ctx, float *y, const float *W, const float *x, int T, int n_in,
                 int n_out)
{
    const float one = 1.0f, zero = 0.0f;
    return cublas_status("cublasSgemm", cuda_blas.sgemm(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T,
                                                    n_in, &one, W, n_in, x, n_in, &zero, y, n_out));
}

static int matmul_gemv(cuda_ctx *ctx, float *y, const uint8_t *W, cairn_type wtype,
                       size_t row_bytes, const float *x, int T, int n_in, int n_out)
{
    const unsigned blocks = (unsigned)((n_out + GEMV_WARPS - 1) / GEMV_WARPS); /* block32 */
    const int is16 = wtype == CAIRN_TYPE_F16 || wtype == CAIRN_TYPE_BF16;
    const int vec16 = is16 && n_in % 8 == 0 && ((uintptr_t)W % 16) == 0 && ((uintptr_t)x % 16) == 0;
    /* Rows per warp for the 16-bit kernel: more rows share each activation
     * load, but leave fewer warps to cover the GPU, so only for several
     * tokens and tall matrices. */
    const int rows_per_warp = T == 1 ? 1 : n_out >= 8192 ? 4 : n_out >= 2048 ? 2 : 1;
    const unsigned blocks16 =
        (unsigned)((n_out + GEMV_WARPS * rows_per_warp - 1) / (GEMV_WARPS * rows_per_warp));
    const int bf16 = wtype == CAIRN_TYPE_BF16;
    for (int t0 = 0; t0 < T; t0 += GEMV_MAX_T) {
        const int nt = T - t0 < GEMV_MAX_T ? T - t0 : GEMV_MAX_T;
        const float *xt = x + (size_t)t0 * n_in;
        float *yt = y + (size_t)t0 * n_out;
        if (vec16 && rows_per_warp == 4)
            gemv16_kernel<4>
                <<<blocks16, 32 * GEMV_WARPS, 0, ctx->stream>>>(yt, W, bf16, xt, nt, n_in, n_out);
        else if (vec16 && rows_per_warp == 2)
            gemv16_kernel<2>
                <<<blocks16, 32 * GEMV_WARPS, 0, ctx->stream>>>(yt, W, bf16, xt, nt, n_in, n_out);
        else if (vec16)
            gemv16_kernel<1>
                <<<blocks16, 32 * GEMV_WARPS, 0, ctx->stream>>>(yt, W, bf16, xt, nt, n_in, n_out);
        else
            gemv_block32_kernel<<<blocks, 32 * GEMV_WARPS, 0, ctx->stream>>>(
                yt, W, (int)wtype, row_bytes, xt, nt, n_in, n_out);
        CUDA_LAUNCHED("gemv");
    }
    return CAIRN_OK;
}

static int matmul_gemm16(cuda_ctx *ctx, float *y, const void *W, cairn_type wtype, const float *x,
                         int T, int n_in, int n_out)
{
    const size_t n = (size_t)T * n_in;
    void *xs;
    int rc = cuda_scratch_reserve(ctx, n * 2, &xs);
    if (rc != CAIRN_OK)
        return rc;
    const int bf16 = wtype == CAIRN_TYPE_BF16;
    to_16bit_kernel<<<grid_1d(n, 256), 256, 0, ctx->stream>>>(xs, x, n, bf16);
    CUDA_LAUNCHED("to_16bit");
    const cudaDataType dt = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const float one = 1.0f, zero = 0.0f;
    return cublas_status("cublasGemmEx",
                         cuda_blas.gemm_ex(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &one,
                                      W, dt, n_in, xs, dt, n_in, &zero, y, CUDA_R_32F, n_out,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static int matmul_dequant_sgemm(cuda_ctx *ctx, float *y, const uint8_t *W, cairn_type wtype,
                                size_t row_bytes, const float *x, int T, int n_in, int n_out)
{
    size_t chunk = DEQUANT_CHUNK_BYTES / ((size_t)n_in * sizeof(float));
    if (chunk < 1)
        chunk = 1;
    if (chunk > (size_t)n_out)
        chunk = (size_t)n_out;
    void *scratch;
    int rc = cuda_scratch_reserve(ctx, chunk * n_in * sizeof(float), &scratch);
    if (rc != CAIRN_OK)
        return rc;
    float *wf = (float *)scratch;
    for (int r0 = 0; r0 < n_out; r0 += (int)chunk) {
        const int rows = n_out - r0 < (int)chunk ? n_out - r0 : (int)chunk;
        dequant_rows_kernel<<<grid_1d((size_t)rows * (n_in / 32), 128), 128, 0, ctx->stream>>>(
            wf, W + (size_t)r0 * row_bytes, (int)wtype, row_bytes, n_in, rows);
        CUDA_LAUNCHED("dequant_rows");
        /* y[:, r0 .. r0+rows) is a column block of C with the same ldc. The
         * stream orders the next chunk's dequantization after this GEMM. */
        const float one = 1.0f, zero = 0.0f;
        rc = cublas_status("cublasSgemm",
                           cuda_blas.sgemm(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, n_in, &one,
                                       wf, n_in, x, n_in, &zero, y + r0, n_out));
        if (rc != CAIRN_OK)
            return rc;
    }
    return CAIRN_OK;
}

/* The T up to which matmul keeps a row to itself (backend.h, "Batch
 * invariance"): the GEMVs run one fmaf chain per output whatever T is, up
 * to their bound; F32 weights always go to cuBLAS, whose kernel depends on
 * the shape. (16-bit weights whose rows are not whole 32-element blocks
 * need 16-byte aligned x for their GEMV; every model's widths are whole
 * blocks.) */
int cuda_matmul_invariant_rows(const cairn_backend *be, cairn_type wtype)
{
    (void)be;
    if (wtype == CAIRN_TYPE_F32)
        return -1;
    if (wtype == CAIRN_TYPE_F16 || wtype == CAIRN_TYPE_BF16)
        return GEMV_16_MAX_T;
    return GEMV_QUANT_MAX_T;
}

int cuda_matmul(cairn_backend *be, float *y, const void *W, cairn_type wtype, const float *x, int T,
                int n_in, int n_out)
{
    if (!be || !y || !W || !x || T <= 0 || n_in <= 0 || n_out <= 0)
        return CAIRN_EINVAL;
    const cairn_type_traits *tt = cairn_type_get(wtype);
    if (!cuda_type_supported(wtype) || !tt || n_in % tt->block_elems != 0)
        return CAIRN_EINVAL;
    if ((const float *)y == x) /* y is written while x is still read */
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);
    const size_t row_bytes = cuda_row_bytes(wtype, n_in);
    const uint8_t *Wb = (const uint8_t *)W;

    if (wtype == CAIRN_TYPE_F32)
        return sgemm(ctx, y, (const float *)W, x, T, n_in, n_out);
    if (wtype == CAIRN_TYPE_F16 || wtype == CAIRN_TYPE_BF16) {
        /* the block-32 GEMV needs whole 32-element blocks; the vector one 8 */
        const int gemv_ok =
            n_in % 32 == 0 || (n_in % 8 == 0 && (uintptr_t)W % 16 == 0 && (uintptr_t)x % 16 == 0);
        if (T <= GEMV_16_MAX_T && gemv_ok)
            return matmul_gemv(ctx, y, Wb, wtype, row_bytes, x, T, n_in, n_out);
        return matmul_gemm16(ctx, y, W, wtype, x, T, n_in, n_out);
    }
    /* quantized: n_in is a whole number of 32-element blocks */
    if (T <= GEMV_QUANT_MAX_T)
        return matmul_gemv(ctx, y, Wb, wtype, row_bytes, x, T, n_in, n_out);
    return matmul_dequant_sgemm(ctx, y, Wb, wtype, row_bytes, x, T, n_in, n_out);
}
