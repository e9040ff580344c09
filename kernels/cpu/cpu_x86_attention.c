/*
 * kernels/cpu/cpu_x86_attention.c — AVX2 and AVX-512 kernels of the CPU
 * backend outside matmul: attention over paged KV (the per-row dot and axpy
 * helpers and the grouped-query kernel of cpu_attention.c) and the
 * element-wise helpers (F32 -> F16 for kv_store, SwiGLU). Together because
 * attention's softmax and SwiGLU share the vector exponential exp_512;
 * every function carries its target attribute (cpu_x86_impl.h).
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_x86_impl.h"

#if CPU_X86_KERNELS

/* ---- attention helpers ----------------------------------------------------- */

static T512 float dot_kv_f16_512(const float *q, const void *k, int n)
{
    const uint16_t *kh = k;
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i),
                              _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kh + i))), acc);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i),
                              _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, kh + i)), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static T512 float dot_kv_f32_512(const float *q, const void *k, int n)
{
    const float *kf = k;
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(kf + i), acc);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i), _mm512_maskz_loadu_ps(m, kf + i),
                              acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static T512 void axpy_kv_f16_512(float *acc, float w, const void *v, int n)
{
    const uint16_t *vh = v;
    const __m512 wv = _mm512_set1_ps(w);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(acc + i,
                         _mm512_fmadd_ps(wv, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vh + i))),
                                         _mm512_loadu_ps(acc + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(acc + i, m,
                              _mm512_fmadd_ps(wv, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, vh + i)),
                                              _mm512_maskz_loadu_ps(m, acc + i)));
    }
}

static T512 void axpy_kv_f32_512(float *acc, float w, const void *v, int n)
{
    const float *vf = v;
    const __m512 wv = _mm512_set1_ps(w);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(wv, _mm512_loadu_ps(vf + i), _mm512_loadu_ps(acc + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(acc + i, m,
                              _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, vf + i),
                                              _mm512_maskz_loadu_ps(m, acc + i)));
    }
}

static T256 float dot_kv_f16_256(const float *q, const void *k, int n)
{
    const uint16_t *kh = k;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kh + i))), acc);
    float sum = hsum256(acc);
    for (; i < n; i++)
        sum = fmaf(q[i], cpu_half_to_float(kh[i]), sum);
    return sum;
}

static T256 void axpy_kv_f16_256(float *acc, float w, const void *v, int n)
{
    const uint16_t *vh = v;
    const __m256 wv = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i,
                         _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vh + i))),
                                         _mm256_loadu_ps(acc + i)));
    for (; i < n; i++)
        acc[i] = fmaf(w, cpu_half_to_float(vh[i]), acc[i]);
}

/* e^x for 16 lanes: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor
 * series to r^7 (truncation error below 2^-27 relative), then scaled by
 * 2^n. Within 2 ulp of expf; -inf and x < -110 give 0, x > 89 gives inf
 * (NaN stays NaN). */
INLINE T512 __m512 exp_512(__m512 x)
{
    /* e^-110 rounds to 0 and e^89 overflows; clamping keeps r and n sane */
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-110.0f)), _mm512_set1_ps(89.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* ln2 split in two so n * ln2_hi is exact */
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* A K or V row of `hd` elements (F16 or F32) as floats into v[hd/16]. */
INLINE T512 void load_kv_row(const uint8_t *p, int hd, int f16, __m512 *v)
{
#pragma GCC unroll 16
    for (int i = 0; i < hd / 16; i++)
        v[i] = f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32 * (size_t)i)))
                   : _mm512_loadu_ps((const float *)(p + 64 * (size_t)i));
}

/* HD and GC: the head size and group size when known at compile time (0:
 * read them from g). With both known, the loops unroll, K/V rows and — when
 * they fit, GC * HD / 16 <= 16 registers — the output accumulators stay in
 * registers; the arithmetic per element is the same either way. */
INLINE T512 void attend_group_512(const cpu_attn_group *g, const int f16, const int HD,
                                  const int GC)
{
    const cairn_kv_layout *L = g->L;
    const int hd = HD ? HD : L->head_dim, ps = L->page_size, G = GC ? GC : g->group;
    const size_t k_off = cairn_kv_offset(L, g->layer, 0, 0) + g->head_off;
    const size_t v_off = cairn_kv_offset(L, g->layer, 1, 0) + g->head_off;
    float *scores = g->scratch;                           /* [G][n_pad]  */
    const size_t n_pad = ((size_t)g->n_scan + 15) / 16 * 16;
    float *q = scores + (size_t)G * n_pad;                /* [G][hd]     */
    float *acc = q + (size_t)G * hd;                      /* [G][hd]     */
    memcpy(q, g->q, sizeof(float) * (size_t)G * hd);
    float max[64];
    for (int h = 0; h < G; h++)
        max[h] = -INFINITY;
    int any = 0;
    __m512 kv[16];

    /* Pass 1: each visible K row is converted once and scored against
     * every query head of the group. */
    for (int j = 0, page_i = 0, row = 0; j < g->n_scan; j++) {
        if (g->mask && !g->mask[j]) {
            for (int h = 0; h < G; h++)
                scores[(size_t)h * n_pad + j] = -INFINITY; /* weight 0 below */
        } else {
            const uint8_t *k = g->pool + (size_t)g->pages[page_i] * L->page_bytes + k_off +
                               (size_t)row * L->row_bytes;
            load_kv_row(k, hd, f16, kv);
#pragma GCC unroll 4
            for (int h = 0; h < G; h++) {
                const float *qh = q + (size_t)h * hd;
                __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qh), kv[0]);
#pragma GCC unroll 16
                for (int i = 1; i < hd / 16; i++)
                    a = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i), kv[i], a);
                const float s = _mm512_reduce_add_ps(a) * g->scale;
                scores[(size_t)h * n_pad + j] = s;
                max[h] = s > max[h] ? s : max[h];
            }
            any = 1;
        }
        if (++row == ps) {
            row = 0;
            page_i++;
        }
    }

    /* Pass 2: softmax weights, 16 at a time (masked entries hold -inf and
     * get 0; so do the padding lanes), then the weighted sum of V rows. */
    float sum[64];
    for (int h = 0; h < G; h++)
        sum[h] = 0.0f;
    const int in_regs = GC && HD && GC * HD / 16 <= 16;
    __m512 ar[16];
    if (in_regs) {
#pragma GCC unroll 16
        for (int i = 0; i < G * hd / 16; i++)
            ar[i] = _mm512_setzero_ps();
    } else {
        memset(acc, 0, sizeof(float) * (size_t)G * hd);
    }
    if (any) {
        for (int h = 0; h < G; h++) {
            float *sh = scores + (size_t)h * n_pad;
            const __m512 mh = _mm512_set1_ps(max[h]);
            __m512 sv = _mm512_setzero_ps();
            for (int j = 0; j < g->n_scan; j += 16) {
                const __mmask16 m = g->n_scan - j >= 16 ? 0xffff
                                  : (__mmask16)((1u << (g->n_scan - j)) - 1);
                const __m512 w = _mm512_maskz_mov_ps(
                    m, exp_512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sh + j), mh)));
                _mm512_storeu_ps(sh + j, w);
                sv = _mm512_add_ps(sv, w);
            }
            sum[h] = _mm512_reduce_add_ps(sv);
        }
        for (int j = 0, page_i = 0, row = 0; j < g->n_scan; j++) {
            if (!g->mask || g->mask[j]) {
                const uint8_t *v = g->pool + (size_t)g->pages[page_i] * L->page_bytes + v_off +
                                   (size_t)row * L->row_bytes;
                load_kv_row(v, hd, f16, kv);
#pragma GCC unroll 4
                for (int h = 0; h < G; h++) {
                    const __m512 wv = _mm512_set1_ps(scores[(size_t)h * n_pad + j]);
                    if (in_regs) {
#pragma GCC unroll 16
                        for (int i = 0; i < hd / 16; i++)
                            ar[h * (hd / 16) + i] = _mm512_fmadd_ps(wv, kv[i], ar[h * (hd / 16) + i]);
                    } else {
                        float *ah = acc + (size_t)h * hd;
                        for (int i = 0; i < hd / 16; i++)
                            _mm512_storeu_ps(ah + 16 * i, _mm512_fmadd_ps(wv, kv[i],
                                                                          _mm512_loadu_ps(ah + 16 * i)));
                    }
                }
            }
            if (++row == ps) {
                row = 0;
                page_i++;
            }
        }
    }
    if (in_regs) {
#pragma GCC unroll 16
        for (int i = 0; i < G * hd / 16; i++)
            _mm512_storeu_ps(acc + 16 * i, ar[i]);
    }
    for (int h = 0; h < G; h++) {
        const float inv = sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f;
        const __m512 iv = _mm512_set1_ps(inv);
        for (int i = 0; i < hd / 16; i++)
            _mm512_storeu_ps(g->out + (size_t)h * hd + 16 * i,
                             _mm512_mul_ps(_mm512_loadu_ps(acc + (size_t)h * hd + 16 * i), iv));
    }
}

#define ATTEND_FN(NAME, F16, HD, GC)                                                               \
    static T512 void NAME(const cpu_attn_group *g) { attend_group_512(g, F16, HD, GC); }
ATTEND_FN(attend_f16_any, 1, 0, 0)
ATTEND_FN(attend_f32_any, 0, 0, 0)
ATTEND_FN(attend_f16_64x1, 1, 64, 1)
ATTEND_FN(attend_f16_64x2, 1, 64, 2)
ATTEND_FN(attend_f16_64x3, 1, 64, 3)
ATTEND_FN(attend_f16_64x4, 1, 64, 4)
ATTEND_FN(attend_f16_128x1, 1, 128, 1)
ATTEND_FN(attend_f16_128x2, 1, 128, 2)
ATTEND_FN(attend_f32_64x1, 0, 64, 1)
ATTEND_FN(attend_f32_64x2, 0, 64, 2)
ATTEND_FN(attend_f32_64x3, 0, 64, 3)
ATTEND_FN(attend_f32_64x4, 0, 64, 4)
ATTEND_FN(attend_f32_128x1, 0, 128, 1)
ATTEND_FN(attend_f32_128x2, 0, 128, 2)

cpu_attend_group_fn cpu_x86_attend_group(cpu_isa isa, const cairn_kv_layout *L, int group)
{
    if (isa < CPU_ISA_AVX512 || L->head_dim % 16 != 0 || L->head_dim > 256 || group > 64)
        return NULL;
    const int f16 = L->dtype == CAIRN_TYPE_F16;
    if (L->head_dim == 64 && group >= 1 && group <= 4) {
        static const cpu_attend_group_fn h64[2][4] = {
            {attend_f32_64x1, attend_f32_64x2, attend_f32_64x3, attend_f32_64x4},
            {attend_f16_64x1, attend_f16_64x2, attend_f16_64x3, attend_f16_64x4},
        };
        return h64[f16][group - 1];
    }
    if (L->head_dim == 128 && group >= 1 && group <= 2) {
        static const cpu_attend_group_fn h128[2][2] = {
            {attend_f32_128x1, attend_f32_128x2},
            {attend_f16_128x1, attend_f16_128x2},
        };
        return h128[f16][group - 1];
    }
    return f16 ? attend_f16_any : attend_f32_any;
}

cpu_dot_kv_fn cpu_x86_dot_kv(cpu_isa isa, cairn_type dtype)
{
    if (isa >= CPU_ISA_AVX512)
        return dtype == CAIRN_TYPE_F16 ? dot_kv_f16_512 : dot_kv_f32_512;
    if (isa >= CPU_ISA_AVX2 && dtype == CAIRN_TYPE_F16)
        return dot_kv_f16_256;
    return NULL;
}

cpu_axpy_kv_fn cpu_x86_axpy_kv(cpu_isa isa, cairn_type dtype)
{
    if (isa >= CPU_ISA_AVX512)
        return dtype == CAIRN_TYPE_F16 ? axpy_kv_f16_512 : axpy_kv_f32_512;
    if (isa >= CPU_ISA_AVX2 && dtype == CAIRN_TYPE_F16)
        return axpy_kv_f16_256;
    return NULL;
}

/* ---- element-wise helpers ------------------------------------------------ */

/* F32 -> F16 with the rounding of cairn_fp32_to_fp16 (nearest even, with
 * subnormals, overflow to inf); NaNs become its canonical quiet NaN. */
static T512 void f32_to_f16_512(uint16_t *dst, const float *src, int n)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
        __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        if (nan) {
            const __m256i signs = _mm512_cvtepi32_epi16(
                _mm512_srli_epi32(_mm512_and_si512(_mm512_castps_si512(x), sign), 16));
            h = _mm256_mask_mov_epi16(h, nan, _mm256_or_si256(signs, _mm256_set1_epi16(0x7e00)));
        }
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

int cpu_x86_f32_to_f16(cpu_isa isa, uint16_t *dst, const float *src, int n)
{
    if (isa < CPU_ISA_AVX512)
        return 0;
    f32_to_f16_512(dst, src, n);
    return 1;
}

/* out = silu(g) * u with silu(g) = g / (1 + e^-g), the scalar kernel's
 * expression with a vector exponential. */
static T512 void swiglu_512(float *out, const float *g, const float *u, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 e = exp_512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

int cpu_x86_swiglu(cpu_isa isa, float *out, const float *g, const float *u, int64_t n)
{
    if (isa < CPU_ISA_AVX512)
        return 0;
    swiglu_512(out, g, u, n);
    return 1;
}

#else /* not x86-64: the scalar reference kernels do everything */

cpu_dot_kv_fn cpu_x86_dot_kv(cpu_isa isa, cairn_type dtype)
{
    (void)isa, (void)dtype;
    return NULL;
}
cpu_axpy_kv_fn cpu_x86_axpy_kv(cpu_isa isa, cairn_type dtype)
{
    (void)isa, (void)dtype;
    return NULL;
}
cpu_attend_group_fn cpu_x86_attend_group(cpu_isa isa, const cairn_kv_layout *L, int group)
{
    (void)isa, (void)L, (void)group;
    return NULL;
}
int cpu_x86_f32_to_f16(cpu_isa isa, uint16_t *dst, const float *src, int n)
{
    (void)isa, (void)dst, (void)src, (void)n;
    return 0;
}
int cpu_x86_swiglu(cpu_isa isa, float *out, const float *g, const float *u, int64_t n)
{
    (void)isa, (void)out, (void)g, (void)u, (void)n;
    return 0;
}
#endif
