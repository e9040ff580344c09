/*
 * kernels/cpu/cpu_x86_impl.h — what the cpu_x86*.c files share, and only
 * they include: the target attributes, the panel geometry that the
 * dispatcher (cpu_x86.c) and the quantized GEMMs must agree on, the small
 * inline helpers every kernel family uses, and the entry points of the
 * quantized families that cpu_x86.c dispatches to.
 *
 * Target attributes are per function, never per file (no #pragma GCC
 * target, no -m flags on the files): every kernel is declared with T512 or
 * T256, so the build needs no -march and cpu_isa_detect() picks the level
 * at run time. A new file of kernels includes this header and marks each of
 * its functions the same way; plain C functions (dispatch, loops over rows)
 * stay unmarked and only call the marked ones.
 *
 * Off x86-64 (or with a compiler without these attributes) CPU_X86_KERNELS
 * is 0, nothing below it is defined, and each file compiles its entry
 * points to stubs that report "not handled".
 */
#ifndef CAIRN_KERNELS_CPU_X86_IMPL_H
#define CAIRN_KERNELS_CPU_X86_IMPL_H

#include <string.h>

#include "kernels/cpu/cpu_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CPU_X86_KERNELS 1
#else
#define CPU_X86_KERNELS 0
#endif

#if CPU_X86_KERNELS

#include <immintrin.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define T256 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* Panel of the quantized GEMM: 32 rows (2 x 16); per block 2 x 8 groups of
 * [16 rows][4 codes] then 2 x 16 float weight scales (Q8_0/Q4_0/Q5_0,
 * cpu_x86_quant.c), or then 4 x 16 floats (the K-quants' scales and mins,
 * layout at pack_panel_k in cpu_x86_kquant.c). */
#define QP_ROWS 32
#define QP_BLOCK_BYTES (2 * 8 * 64 + 2 * 64)
#define KP_BLOCK_BYTES (2 * 8 * 64 + 4 * 64)
/* Tokens per GEMM tile. On AVX-512 the panel GEMM serves every batch size,
 * decode included: a token's row is then the same sequence of operations
 * (integer block sums, one FMA per block in block order, 16 rows a lane)
 * whether it is computed alone, among other requests' tokens or in any
 * prompt chunk, so batching never changes a result. (Row-at-a-time decode
 * kernels summed in another order and were used below 4 tokens: a request
 * decoded alone and in a batch differed in the last bits.) */
#define QG_TOKENS 6

static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return cpu_half_to_float(h);
}

/* Sum of the 8 lanes in a fixed order. */
INLINE T256 float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The quantized families behind cpu_x86_matmul_q8act, which has checked
 * isa >= CPU_ISA_AVX2 and the weight type: each picks its kernel from the
 * level and T and computes y[t][r] for r in [r0, r1), t in [0, T), with
 * the arguments of cpu_x86_matmul_q8act. */
/* Q8_0, Q4_0, Q5_0 (cpu_x86_quant.c). */
void cpu_x86_matmul_q8(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                       size_t row_bytes, const int8_t *q, const float *d, const int32_t *s, int T,
                       int n_in, int n_out, int64_t r0, int64_t r1, void *pack);
/* Q4_K, Q5_K, Q6_K (cpu_x86_kquant.c). */
void cpu_x86_matmul_kq(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                       size_t row_bytes, const int8_t *q, const float *d, const int32_t *s, int T,
                       int n_in, int n_out, int64_t r0, int64_t r1, void *pack);

#endif /* CPU_X86_KERNELS */
#endif /* CAIRN_KERNELS_CPU_X86_IMPL_H */
