/*
 * kernels/cpu/cpu_x86.c — the x86 SIMD side of the CPU backend: choosing
 * the instruction-set level and quantizing activations to int8.
 *
 * The AVX2 and AVX-512 kernels themselves live in one file per family, each
 * family whole in its file (its kernels, their inline helpers and the plain
 * C loop that drives them), so the intrinsics and the target attributes
 * they need stay together:
 *   cpu_x86_float.c      F32/F16/BF16/F8_E4M3 weights: dot-product tiles
 *                        and panels
 *   cpu_x86_quant.c      every quantized type (Q8_0/Q4_0/Q5_0/Q4_Z/MXFP4 and the
 *                        K-quants), in the packed layout (cpu_pack.c)
 *   cpu_x86_attention.c  attention over paged KV, F32->F16, SwiGLU
 *   cpu_x86_impl.h       what they share (target attributes, helpers);
 *                        included by these files only
 *
 * Every kernel carries a target attribute (T512/T256, cpu_x86_impl.h)
 * instead of relying on the build's -march, so the same binary runs
 * everywhere and cpu_isa_detect() picks the level at run time. Off x86-64
 * every file compiles to stubs that report "not handled" and the scalar
 * reference kernels run.
 *
 * Determinism: every kernel computes each output element with a fixed
 * sequence of operations whatever the tile, the batch and the thread split
 * (the files say how), so results do not depend on the thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_x86_impl.h"

/* ---- level detection ---------------------------------------------------- */

const char *cpu_isa_name(cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_AVX512: return "avx512-vnni";
    case CPU_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

cpu_isa cpu_isa_detect(void)
{
    cpu_isa best = CPU_ISA_SCALAR;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        best = CPU_ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
            best = CPU_ISA_AVX512;
    }
#endif
    const char *cap = getenv("CAIRN_CPU_ISA");
    if (cap && *cap) {
        cpu_isa want = best;
        if (strcmp(cap, "scalar") == 0)
            want = CPU_ISA_SCALAR;
        else if (strcmp(cap, "avx2") == 0)
            want = CPU_ISA_AVX2;
        else if (strcmp(cap, "avx512") == 0)
            want = CPU_ISA_AVX512;
        if (want < best)
            best = want;
    }
    return best;
}

int cpu_has_bf16(cpu_isa isa)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    const char *off = getenv("CAIRN_CPU_BF16");
    return isa >= CPU_ISA_AVX512 && __builtin_cpu_supports("avx512bf16") &&
           !(off && strcmp(off, "0") == 0);
#else
    (void)isa;
    return 0;
#endif
}

void cpu_quantize_act_block_ref(const float *x, int8_t *q, float *d, int32_t *sum, int32_t *sum_lo)
{
    float amax = 0.0f;
    for (int i = 0; i < 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    const float scale = amax / 127.0f;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    int32_t s = 0;
    for (int i = 0; i < 32; i++) {
        /* nearest, ties to even: what the vector conversion does */
        const int v = (int)nearbyintf(x[i] * inv);
        q[i] = (int8_t)v;
        s += v;
        if (i == 15)
            *sum_lo = s;
    }
    *d = scale;
    *sum = s;
}

#if CPU_X86_KERNELS

/* ---- activation quantization ------------------------------------------- */

T512 static void quantize_act_512(const float *x, int n, int8_t *q, size_t q_stride, float *d,
                                  int32_t *s, int32_t *s_lo, size_t stride)
{
    for (int b = 0; b < n / 32; b++) {
        __m512 x0 = _mm512_loadu_ps(x + 32 * b);
        __m512 x1 = _mm512_loadu_ps(x + 32 * b + 16);
        __m512 m = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1));
        const float amax = _mm512_reduce_max_ps(m);
        const float scale = amax / 127.0f;
        const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        const __m512 vinv = _mm512_set1_ps(inv);
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vinv));
        __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vinv));
        int8_t *qb = q + (size_t)b * q_stride;
        _mm_storeu_si128((__m128i *)qb, _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qb + 16), _mm512_cvtepi32_epi8(i1));
        const int32_t lo = _mm512_reduce_add_epi32(i0);
        d[(size_t)b * stride] = scale;
        s_lo[(size_t)b * stride] = lo;
        s[(size_t)b * stride] = lo + _mm512_reduce_add_epi32(i1);
    }
}

int cpu_x86_quantize_act(cpu_isa isa, const float *x, int n, int8_t *q, size_t q_stride,
                         float *d, int32_t *s, int32_t *s_lo, size_t stride)
{
    if (isa >= CPU_ISA_AVX512) {
        quantize_act_512(x, n, q, q_stride, d, s, s_lo, stride);
        return 1;
    }
    return 0;
}

#else /* not x86-64: the scalar reference kernels do everything */

int cpu_x86_quantize_act(cpu_isa isa, const float *x, int n, int8_t *q, size_t q_stride,
                         float *d, int32_t *s, int32_t *s_lo, size_t stride)
{
    (void)isa, (void)x, (void)n, (void)q, (void)q_stride, (void)d, (void)s, (void)s_lo;
    (void)stride;
    return 0;
}
#endif
