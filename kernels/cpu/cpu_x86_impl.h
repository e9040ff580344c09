/*
 * kernels/cpu/cpu_x86_impl.h — what the cpu_x86*.c files share, and only
 * they include: the target attributes and the small inline helpers every
 * kernel family uses.
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

#endif /* CPU_X86_KERNELS */
#endif /* CAIRN_KERNELS_CPU_X86_IMPL_H */
