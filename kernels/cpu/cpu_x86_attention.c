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

/* `n` K or V rows of the tile starting at key j0 as F32 into t[16][hd];
 * rows n..15 are zeroed so the unused scores are finite. */
INLINE T512 void load_tile(const cpu_attn_item *it, size_t kv_off, int j0, int n, int f16, int hd,
                           float *t)
{
    const cairn_kv_layout *L = it->L;
    const int ps = L->page_size;
    for (int r = 0; r < n; r++) {
        const int j = j0 + r;
        const uint8_t *p = it->pool + (size_t)it->pages[j / ps] * L->page_bytes + kv_off +
                           (size_t)(j % ps) * L->row_bytes;
        float *dst = t + (size_t)r * hd;
        for (int i = 0; i < hd; i += 16)
            _mm512_store_ps(dst + i,
                            f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * (size_t)i)))
                                : _mm512_loadu_ps((const float *)p + i));
    }
    if (n < CPU_ATTN_TILE)
        memset(t + (size_t)n * hd, 0, sizeof(float) * (size_t)(CPU_ATTN_TILE - n) * hd);
}

/* Asks for the K and V rows of the tile at j0 to come into cache. */
INLINE T512 void prefetch_tile(const cpu_attn_item *it, size_t k_off, size_t v_off, int j0, int n,
                               int f16, int hd)
{
    const cairn_kv_layout *L = it->L;
    const int ps = L->page_size;
    const size_t row = (size_t)hd * (f16 ? 2 : 4);
    for (int r = 0; r < n; r++) {
        const int j = j0 + r;
        const uint8_t *base = it->pool + (size_t)it->pages[j / ps] * L->page_bytes +
                              (size_t)(j % ps) * L->row_bytes;
        for (size_t b = 0; b < row; b += 64) {
            _mm_prefetch((const char *)(base + k_off + b), _MM_HINT_T0);
            _mm_prefetch((const char *)(base + v_off + b), _MM_HINT_T0);
        }
    }
}

/* The kernel keeps one query vector per lane: a lane group is 16 vectors of
 * the item (vector v = row * group + head sits in group v / 16, lane v % 16),
 * its state acc[head_dim][16], m[16], l[16] (cpu_attn_state_floats). For a
 * tile of 16 keys t it computes, all lanes at once,
 *
 *   S[t]  = sum_d qs[d] * K[t][d]          qs = scale * q, d in order
 *   m'    = max(m, S[0], ..., S[15])       invisible keys score -inf
 *   alpha = m' == m ? 1 : e^(m - m')
 *   P[t]  = visible ? e^(S[t] - m') : 0
 *   l     = l * alpha + P[0] + ... + P[15]
 *   acc[d] = acc[d] * alpha + P[0] V[0][d] + ... (only visible lanes change)
 *
 * with every key's K/V element broadcast from the F32 tile: no horizontal
 * sums at all, two FMAs per key and dimension per 16 vectors. Each lane's
 * arithmetic is that of its vector alone, in a fixed order, so which lane
 * or item a vector lands in changes nothing.
 *
 * HD: the head size when known at compile time (0: from the layout). */
INLINE T512 void attend_chunk_512(const cpu_attn_item *it, int chunk, float *partial, const int f16,
                                  const int HD)
{
    const cairn_kv_layout *L = it->L;
    const int hd = HD ? HD : L->head_dim, G = it->group;
    const size_t stride = cpu_attn_state_floats(hd);
    const int n_vec = it->n_rows * G, n_groups = (n_vec + 15) / 16;
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY), one = _mm512_set1_ps(1.0f);
    cpu_attn_state_clear(partial, n_groups, hd);
    for (int g = 0; g < n_groups; g++) {
        float *qt = it->q_t + (size_t)g * hd * 16; /* [hd][16] */
        for (int lane = 0; lane < 16; lane++) {
            const int v = g * 16 + lane;
            const float *q = v < n_vec ? it->q + (size_t)(v / G) * it->row_stride + (size_t)(v % G) * hd
                                       : NULL;
            for (int d = 0; d < hd; d++)
                qt[(size_t)d * 16 + lane] = q ? q[d] * it->scale : 0.0f;
        }
    }
    int max_scan = 0, min_skip = INT32_MAX;
    for (int r = 0; r < it->n_rows; r++) {
        max_scan = it->n_scan[r] > max_scan ? it->n_scan[r] : max_scan;
        min_skip = it->n_skip[r] < min_skip ? it->n_skip[r] : min_skip;
    }
    /* tiles keep their place (multiples of 16 keys from the chunk's start,
     * whatever rows share the item); only those below every row's window
     * are skipped */
    const int c_begin = chunk * CPU_ATTN_CHUNK;
    const int j_end = max_scan < c_begin + CPU_ATTN_CHUNK ? max_scan : c_begin + CPU_ATTN_CHUNK;
    int j_begin = c_begin;
    if (min_skip > j_begin) /* may pass j_end: then the chunk shows nothing */
        j_begin += (min_skip - j_begin) / CPU_ATTN_TILE * CPU_ATTN_TILE;
    const size_t k_off = cairn_kv_offset(L, it->layer, 0, 0) + it->head_off;
    const size_t v_off = cairn_kv_offset(L, it->layer, 1, 0) + it->head_off;
    float *kt = it->kv_tile;                     /* [16][hd] */
    float *vt = kt + (size_t)CPU_ATTN_TILE * hd; /* [16][hd] */
    float pbuf[CPU_ATTN_TILE * 16] __attribute__((aligned(64)));
    /* each lane's n_scan (0 for lanes past the last vector), once per chunk:
     * the tile loop then needs no division by the group size */
    int32_t lane_scan[CPU_ATTN_LANE_GROUPS_MAX][16] __attribute__((aligned(64)));
    int32_t lane_skip[CPU_ATTN_LANE_GROUPS_MAX][16] __attribute__((aligned(64)));
    for (int g = 0; g < n_groups; g++)
        for (int lane = 0; lane < 16; lane++) {
            const int v = g * 16 + lane;
            lane_scan[g][lane] = v < n_vec ? it->n_scan[v / G] : 0;
            lane_skip[g][lane] = v < n_vec ? it->n_skip[v / G] : 0;
        }

    for (int j0 = j_begin; j0 < j_end; j0 += CPU_ATTN_TILE) {
        const int tn = j_end - j0 < CPU_ATTN_TILE ? j_end - j0 : CPU_ATTN_TILE;
        load_tile(it, k_off, j0, tn, f16, hd, kt);
        load_tile(it, v_off, j0, tn, f16, hd, vt);
        if (j0 + CPU_ATTN_TILE < j_end) /* the next tile's rows, while this one is worked on */
            prefetch_tile(it, k_off, v_off, j0 + CPU_ATTN_TILE,
                          j_end - j0 - CPU_ATTN_TILE < CPU_ATTN_TILE ? j_end - j0 - CPU_ATTN_TILE
                                                                     : CPU_ATTN_TILE,
                          f16, hd);
        for (int g = 0; g < n_groups; g++) {
            /* keys j0 .. j0 + ln - 1 of the tile lie inside each lane's row */
            const __m512i ln = _mm512_max_epi32(
                _mm512_setzero_si512(),
                _mm512_min_epi32(_mm512_sub_epi32(_mm512_load_si512(lane_scan[g]), _mm512_set1_epi32(j0)),
                                 _mm512_set1_epi32(tn)));
            /* and from key j0 + lo on (the window's first key in the tile) */
            const __m512i lo = _mm512_max_epi32(
                _mm512_setzero_si512(),
                _mm512_sub_epi32(_mm512_load_si512(lane_skip[g]), _mm512_set1_epi32(j0)));
            if (!_mm512_cmp_epi32_mask(lo, ln, _MM_CMPINT_LT))
                continue;
            __mmask16 vis[CPU_ATTN_TILE];
            for (int t = 0; t < tn; t++) {
                vis[t] = _mm512_cmp_epi32_mask(_mm512_set1_epi32(t), ln, _MM_CMPINT_LT) &
                         _mm512_cmp_epi32_mask(_mm512_set1_epi32(t), lo, _MM_CMPINT_GE);
                if (it->mask)
                    for (int lane = 0; lane < 16; lane++)
                        if ((vis[t] >> lane & 1) &&
                            !it->mask[(size_t)((g * 16 + lane) / G) * it->mask_stride + j0 + t])
                            vis[t] &= (__mmask16)~(1u << lane);
            }
            float *st = partial + (size_t)g * stride;
            const float *qt = it->q_t + (size_t)g * hd * 16;

            /* scores: 16 accumulators, one per key */
            __m512 S[CPU_ATTN_TILE];
#pragma GCC unroll 16
            for (int t = 0; t < CPU_ATTN_TILE; t++)
                S[t] = _mm512_setzero_ps();
            for (int d = 0; d < hd; d++) {
                const __m512 qd = _mm512_load_ps(qt + (size_t)d * 16);
#pragma GCC unroll 16
                for (int t = 0; t < CPU_ATTN_TILE; t++)
                    S[t] = _mm512_fmadd_ps(_mm512_set1_ps(kt[(size_t)t * hd + d]), qd, S[t]);
            }
            /* the running maximum, what the state is worth under it, the weights */
            __m512 tmax = neg_inf;
            for (int t = 0; t < tn; t++) {
                S[t] = _mm512_mask_mov_ps(neg_inf, vis[t], S[t]);
                tmax = _mm512_max_ps(tmax, S[t]);
            }
            const __m512 m_old = _mm512_load_ps(st + (size_t)hd * 16);
            const __m512 m_new = _mm512_max_ps(m_old, tmax);
            const __mmask16 same = _mm512_cmp_ps_mask(m_new, m_old, _CMP_EQ_OQ);
            const __m512 alpha = _mm512_mask_mov_ps(exp_512(_mm512_sub_ps(m_old, m_new)), same, one);
            __m512 l = _mm512_mul_ps(_mm512_load_ps(st + (size_t)hd * 16 + 16), alpha);
            for (int t = 0; t < tn; t++) {
                const __m512 w = _mm512_maskz_mov_ps(vis[t], exp_512(_mm512_sub_ps(S[t], m_new)));
                _mm512_store_ps(pbuf + 16 * t, w);
                l = _mm512_add_ps(l, w);
            }
            _mm512_store_ps(st + (size_t)hd * 16, m_new);
            _mm512_store_ps(st + (size_t)hd * 16 + 16, l);

            /* acc = acc * alpha + sum_t P[t] V[t], 16 dimensions at a time */
            for (int d0 = 0; d0 < hd; d0 += 16) {
                __m512 acc[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    acc[i] = _mm512_mul_ps(_mm512_load_ps(st + (size_t)(d0 + i) * 16), alpha);
                for (int t = 0; t < tn; t++) {
                    const __m512 w = _mm512_load_ps(pbuf + 16 * t);
                    const float *vr = vt + (size_t)t * hd + d0;
#pragma GCC unroll 16
                    for (int i = 0; i < 16; i++)
                        acc[i] = _mm512_mask3_fmadd_ps(w, _mm512_set1_ps(vr[i]), acc[i], vis[t]);
                }
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    _mm512_store_ps(st + (size_t)(d0 + i) * 16, acc[i]);
            }
        }
    }
}

#define ATTEND_FN(NAME, F16, HD)                                                                   \
    static T512 void NAME(const cpu_attn_item *it, int chunk, float *partial)                     \
    {                                                                                              \
        attend_chunk_512(it, chunk, partial, F16, HD);                                             \
    }
ATTEND_FN(attend_f16_any, 1, 0)
ATTEND_FN(attend_f32_any, 0, 0)
ATTEND_FN(attend_f16_64, 1, 64)
ATTEND_FN(attend_f32_64, 0, 64)
ATTEND_FN(attend_f16_128, 1, 128)
ATTEND_FN(attend_f32_128, 0, 128)

cpu_attend_chunk_fn cpu_x86_attend_chunk(cpu_isa isa, const cairn_kv_layout *L)
{
    if (isa < CPU_ISA_AVX512 || L->head_dim % 16 != 0 || L->head_dim > 256 ||
        (L->dtype != CAIRN_TYPE_F16 && L->dtype != CAIRN_TYPE_F32))
        return NULL;
    const int f16 = L->dtype == CAIRN_TYPE_F16;
    if (L->head_dim == 64)
        return f16 ? attend_f16_64 : attend_f32_64;
    if (L->head_dim == 128)
        return f16 ? attend_f16_128 : attend_f32_128;
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
cpu_attend_chunk_fn cpu_x86_attend_chunk(cpu_isa isa, const cairn_kv_layout *L)
{
    (void)isa, (void)L;
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
