/*
 * common/quant.c — the reference (de)quantizers: the definition of every
 * weight format cairn computes with, in GGUF's block layouts (the table in
 * common/common.h), and simple quantizers for tests and tools.
 *
 * The dequantizers fix the float arithmetic as well as the layout:
 *   Q5_0  x = d * (q - 16)
 *   Q4_K  x = (d * sc) * q - (dmin * m)      (per 32-element sub-block)
 *   Q5_K  the same with 5-bit q
 *   Q6_K  x = (d * sc) * (q - 32)            (per 16-element sub-block)
 *   Q4_Z  x = d * (q - z)                    (cairn's AWQ/GPTQ layout)
 *   F8_E4M3  x = d * e4m3(q)                 (d a float per block of 32)
 *   MXFP4 x = E2M1[q] * 2^(e - 127)          (exact in float)
 * with d, dmin read from fp16 and each parenthesised product rounded to float
 * once, so the kernels and the tests have one exact value to agree on.
 *
 * The quantizers are plain min/max (or max-magnitude) fits per sub-block,
 * with the 6- or 8-bit sub-block scales rounded so that the sub-block's range
 * stays representable. They are meant for tests and tools; they do not try
 * to minimise the error the way GGUF's own writers do, and need not produce
 * the same bytes.
 */
#include "common/common.h"

#include <math.h>
#include <string.h>

#define QK_SUPER 256

static inline uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The largest magnitude of a 32-element block. */
static float block_amax(const float *x)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

/* ---- the 6-bit scale/min packing of Q4_K and Q5_K ------------------------- */

/* 12 bytes hold 8 scales and 8 mins of 6 bits: for sub-blocks 0-3 the low 6
 * bits of bytes 0-3 (scales) and 4-7 (mins); for sub-blocks 4-7 the low
 * nibble (scale) and high nibble (min) of bytes 8-11, with their top 2 bits
 * in the top 2 bits of bytes 0-3 (scales) and 4-7 (mins). */
static void unpack_scales(const uint8_t *packed, uint8_t sc[8], uint8_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = packed[j] & 63;
        mn[j] = packed[j + 4] & 63;
        sc[j + 4] = (uint8_t)((packed[j + 8] & 0x0f) | ((packed[j] >> 6) << 4));
        mn[j + 4] = (uint8_t)((packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4));
    }
}

static void pack_scales(const uint8_t sc[8], const uint8_t mn[8], uint8_t *packed)
{
    for (int j = 0; j < 4; j++) {
        packed[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        packed[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        packed[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((mn[j + 4] & 0x0f) << 4));
    }
}

/* ---- dequantization --------------------------------------------------------- */

/* Twice each E2M1 code's value: integers, so a block is small ints times
 * one power of two. */
static const int8_t MXFP4_TWICE[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

int cairn_mxfp4_to_q5_0(const void *src, void *dst, int64_t n, int64_t *inexact)
{
    if (n % 32)
        return CAIRN_EINVAL;
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (int64_t b = 0; b < n / 32; b++, s += 17, d += 22) {
        const float scale = ldexpf(1.0f, (int)s[0] - 128);
        const uint16_t h = cairn_fp32_to_fp16(scale);
        if (inexact && cairn_fp16_to_fp32(h) != scale)
            (*inexact)++;
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int lo = 16 + MXFP4_TWICE[s[1 + j] & 0x0f]; /* 4 .. 28 */
            const int hi = 16 + MXFP4_TWICE[s[1 + j] >> 4];
            d[6 + j] = (uint8_t)((lo & 0x0f) | ((hi & 0x0f) << 4));
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + 16);
        }
        d[0] = (uint8_t)(h & 0xff);
        d[1] = (uint8_t)(h >> 8);
        for (int k = 0; k < 4; k++)
            d[2 + k] = (uint8_t)(qh >> (8 * k));
    }
    return CAIRN_OK;
}

static void dequant_q5_0(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 22, y += 32) {
        const float d = cairn_fp16_to_fp32(rd16(s));
        const uint32_t qh = (uint32_t)s[2] | ((uint32_t)s[3] << 8) | ((uint32_t)s[4] << 16) |
                            ((uint32_t)s[5] << 24);
        for (int j = 0; j < 16; j++) {
            const int lo = (s[6 + j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
            const int hi = (s[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = d * (float)(lo - 16);
            y[j + 16] = d * (float)(hi - 16);
        }
    }
}

/* Q4_K (bits == 4) and Q5_K (bits == 5): d, dmin, 12 scale bytes, [Q5_K: 32
 * bytes of high bits], 128 bytes of nibbles. Nibble byte 32p + l holds
 * element l of sub-block 2p (low) and of 2p + 1 (high); Q5_K's high bit of
 * element l of sub-block j is bit j of qh[l]. */
static void dequant_q45_k(const uint8_t *s, float *y, int64_t nb, int bits)
{
    const size_t bs = bits == 4 ? 144 : 176;
    for (int64_t b = 0; b < nb; b++, s += bs, y += QK_SUPER) {
        const float d = cairn_fp16_to_fp32(rd16(s));
        const float dmin = cairn_fp16_to_fp32(rd16(s + 2));
        uint8_t sc[8], mn[8];
        unpack_scales(s + 4, sc, mn);
        const uint8_t *qh = s + 16;
        const uint8_t *qs = bits == 4 ? s + 16 : s + 48;
        for (int j = 0; j < 8; j++) {
            const float scale = d * (float)sc[j];
            const float offset = dmin * (float)mn[j];
            const uint8_t *nib = qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int q = (j & 1) ? nib[l] >> 4 : nib[l] & 0x0f;
                if (bits == 5)
                    q |= ((qh[l] >> j) & 1) << 4;
                y[32 * j + l] = scale * (float)q - offset;
            }
        }
    }
}

/* Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8
 * scales, then d. Each 128-element half h uses ql[64h..], qh[32h..]: element
 * l (0..31) of its four 32-element quarters k = 0..3 takes the low nibble of
 * ql[l] (k=0), ql[l+32] (k=1), the high nibble of ql[l] (k=2), ql[l+32]
 * (k=3), and bits 2k, 2k+1 of qh[l] as bits 4-5. Sub-block (scale) i covers
 * elements 16i..16i+15 of the super-block. */
static void dequant_q6_k(const uint8_t *s, float *y, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, s += 210, y += QK_SUPER) {
        const float d = cairn_fp16_to_fp32(rd16(s + 208));
        const int8_t *scales = (const int8_t *)(s + 192);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = s + 64 * h, *qh = s + 128 + 32 * h;
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t lowbyte = ql[l + 32 * (k & 1)];
                    const int low = k < 2 ? lowbyte & 0x0f : lowbyte >> 4;
                    const int q = low | (((qh[l] >> (2 * k)) & 3) << 4);
                    const int e = 128 * h + 32 * k + l;
                    y[e] = (d * (float)scales[e / 16]) * (float)(q - 32);
                }
        }
    }
}

static int kquant_dequantize_row(int type, const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    switch (type) {
    case CAIRN_TYPE_Q5_0:
        if (n % 32)
            return CAIRN_EINVAL;
        dequant_q5_0(s, dst, n / 32);
        return CAIRN_OK;
    case CAIRN_TYPE_Q4_K:
    case CAIRN_TYPE_Q5_K:
        if (n % QK_SUPER)
            return CAIRN_EINVAL;
        dequant_q45_k(s, dst, n / QK_SUPER, type == CAIRN_TYPE_Q4_K ? 4 : 5);
        return CAIRN_OK;
    case CAIRN_TYPE_Q6_K:
        if (n % QK_SUPER)
            return CAIRN_EINVAL;
        dequant_q6_k(s, dst, n / QK_SUPER);
        return CAIRN_OK;
    default:
        return CAIRN_EUNSUPPORTED;
    }
}

/* ---- quantization ----------------------------------------------------------- */

/* fp16 of a non-negative v, rounded up if round-to-nearest fell below v, so
 * that v / fp16(v) never exceeds 1 (a scale never shrinks the range). */
static uint16_t fp16_at_least(float v)
{
    uint16_t h = cairn_fp32_to_fp16(v);
    if (cairn_fp16_to_fp32(h) < v && h < 0x7bff)
        h++;
    return h;
}

static void quant_q5_0(const float *x, uint8_t *out, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += 32, out += 22) {
        /* As Q4_0: the value of largest magnitude, with its sign, maps to
         * code 0 (-16), using the whole code range on that side. */
        float amax = 0, vmax = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                vmax = x[j];
            }
        const uint16_t dh = cairn_fp32_to_fp16(vmax / -16.0f);
        const float d = cairn_fp16_to_fp32(dh);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr16(out, dh);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int lo = clampi((int)floorf(x[j] * id + 16.5f), 0, 31);
            const int hi = clampi((int)floorf(x[j + 16] * id + 16.5f), 0, 31);
            out[6 + j] = (uint8_t)((lo & 0x0f) | ((hi & 0x0f) << 4));
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + 16);
        }
        for (int i = 0; i < 4; i++)
            out[2 + i] = (uint8_t)(qh >> (8 * i));
    }
}

static void quant_q45_k(const float *x, uint8_t *out, int64_t nb, int bits)
{
    const size_t bs = bits == 4 ? 144 : 176;
    const int qmax = (1 << bits) - 1;
    for (int64_t b = 0; b < nb; b++, x += QK_SUPER, out += bs) {
        memset(out, 0, bs);
        /* Sub-block j: x ~ scale * q - offset with offset = -min(0, min x). */
        float offset[8], hi[8], max_off = 0, max_scale = 0;
        for (int j = 0; j < 8; j++) {
            float lo = 0, h = -INFINITY;
            for (int l = 0; l < 32; l++) {
                lo = fminf(lo, x[32 * j + l]);
                h = fmaxf(h, x[32 * j + l]);
            }
            offset[j] = -lo;
            hi[j] = h;
            max_off = fmaxf(max_off, offset[j]);
        }
        /* Offsets first (rounded up, so every value stays >= -offset), then
         * scales from the quantized offsets (rounded up, so the top value
         * stays <= qmax * scale). */
        const uint16_t dminh = fp16_at_least(max_off / 63.0f);
        const float dmin = cairn_fp16_to_fp32(dminh);
        uint8_t sc[8], mn[8];
        float qoff[8], need[8];
        for (int j = 0; j < 8; j++) {
            mn[j] = dmin > 0 ? (uint8_t)clampi((int)ceilf(offset[j] / dmin), 0, 63) : 0;
            qoff[j] = dmin * (float)mn[j];
            need[j] = fmaxf(hi[j] + qoff[j], 0.0f) / (float)qmax;
            max_scale = fmaxf(max_scale, need[j]);
        }
        const uint16_t dh = fp16_at_least(max_scale / 63.0f);
        const float d = cairn_fp16_to_fp32(dh);
        for (int j = 0; j < 8; j++)
            sc[j] = d > 0 ? (uint8_t)clampi((int)ceilf(need[j] / d), 0, 63) : 0;
        wr16(out, dh);
        wr16(out + 2, dminh);
        pack_scales(sc, mn, out + 4);
        uint8_t *qh = out + 16;
        uint8_t *qs = bits == 4 ? out + 16 : out + 48;
        for (int j = 0; j < 8; j++) {
            /* the same float values the dequantizer will use */
            const float scale = d * (float)sc[j];
            const float off = dmin * (float)mn[j];
            const float inv = scale > 0 ? 1.0f / scale : 0.0f;
            for (int l = 0; l < 32; l++) {
                const int q = clampi((int)nearbyintf((x[32 * j + l] + off) * inv), 0, qmax);
                qs[32 * (j / 2) + l] |= (uint8_t)((q & 0x0f) << (4 * (j & 1)));
                if (bits == 5)
                    qh[l] |= (uint8_t)((q >> 4) << j);
            }
        }
    }
}

static void quant_q6_k(const float *x, uint8_t *out, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++, x += QK_SUPER, out += 210) {
        memset(out, 0, 210);
        /* Sub-block i of 16: scale_i = -(value of largest magnitude) / 32, so
         * that value maps to code 0; the scales themselves are int8 multiples
         * of one fp16 d. */
        float scale[16], max_abs_scale = 0;
        for (int i = 0; i < 16; i++) {
            float amax = 0, vmax = 0;
            for (int l = 0; l < 16; l++)
                if (fabsf(x[16 * i + l]) > amax) {
                    amax = fabsf(x[16 * i + l]);
                    vmax = x[16 * i + l];
                }
            scale[i] = vmax / -32.0f;
            max_abs_scale = fmaxf(max_abs_scale, amax / 32.0f);
        }
        /* rounded up, so no sub-block scale needs more than |127| steps */
        const uint16_t dh = fp16_at_least(max_abs_scale / 127.0f);
        const float d = cairn_fp16_to_fp32(dh);
        const float id = d > 0 ? 1.0f / d : 0.0f;
        int8_t *scales = (int8_t *)(out + 192);
        for (int i = 0; i < 16; i++)
            scales[i] = (int8_t)clampi((int)nearbyintf(scale[i] * id), -128, 127);
        wr16(out + 208, dh);
        for (int e = 0; e < QK_SUPER; e++) {
            const float s = d * (float)scales[e / 16];
            const int q = s != 0.0f ? clampi((int)nearbyintf(x[e] / s) + 32, 0, 63) : 32;
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            uint8_t *ql = out + 64 * h + l + 32 * (k & 1);
            *ql |= (uint8_t)((q & 0x0f) << (k < 2 ? 0 : 4));
            out[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
        }
    }
}

static int kquant_quantize_row(int type, const float *src, void *dst, int64_t n)
{
    uint8_t *d = dst;
    switch (type) {
    case CAIRN_TYPE_Q5_0:
        if (n % 32)
            return CAIRN_EINVAL;
        quant_q5_0(src, d, n / 32);
        return CAIRN_OK;
    case CAIRN_TYPE_Q4_K:
    case CAIRN_TYPE_Q5_K:
        if (n % QK_SUPER)
            return CAIRN_EINVAL;
        quant_q45_k(src, d, n / QK_SUPER, type == CAIRN_TYPE_Q4_K ? 4 : 5);
        return CAIRN_OK;
    case CAIRN_TYPE_Q6_K:
        if (n % QK_SUPER)
            return CAIRN_EINVAL;
        quant_q6_k(src, d, n / QK_SUPER);
        return CAIRN_OK;
    default:
        return CAIRN_EUNSUPPORTED;
    }
}

/* ---- reference (de)quantization ---------------------------------------- */

int cairn_dequantize_row(int type, const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    switch (type) {
    case CAIRN_TYPE_F32:
        memcpy(dst, src, (size_t)n * 4);
        return CAIRN_OK;
    case CAIRN_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = cairn_fp16_to_fp32(rd16(s + 2 * i));
        return CAIRN_OK;
    case CAIRN_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = cairn_bf16_to_fp32(rd16(s + 2 * i));
        return CAIRN_OK;
    case CAIRN_TYPE_Q8_0:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, s += 34) {
            float d = cairn_fp16_to_fp32(rd16(s));
            for (int j = 0; j < 32; j++)
                dst[b * 32 + j] = d * (float)(int8_t)s[2 + j];
        }
        return CAIRN_OK;
    case CAIRN_TYPE_Q4_0:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, s += 18) {
            float d = cairn_fp16_to_fp32(rd16(s));
            for (int j = 0; j < 16; j++) {
                dst[b * 32 + j] = d * (float)((s[2 + j] & 0x0f) - 8);
                dst[b * 32 + j + 16] = d * (float)((s[2 + j] >> 4) - 8);
            }
        }
        return CAIRN_OK;
    case CAIRN_TYPE_Q4_Z:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, s += 20) {
            const float d = cairn_fp16_to_fp32(rd16(s));
            const int z = s[2];
            for (int j = 0; j < 16; j++) {
                dst[b * 32 + j] = d * (float)((s[4 + j] & 0x0f) - z);
                dst[b * 32 + j + 16] = d * (float)((s[4 + j] >> 4) - z);
            }
        }
        return CAIRN_OK;
    case CAIRN_TYPE_MXFP4:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, s += 17) {
            /* twice the E2M1 value, times 2^(e - 128) */
            const float d = ldexpf(1.0f, (int)s[0] - 128);
            for (int j = 0; j < 16; j++) {
                dst[b * 32 + j] = d * (float)MXFP4_TWICE[s[1 + j] & 0x0f];
                dst[b * 32 + j + 16] = d * (float)MXFP4_TWICE[s[1 + j] >> 4];
            }
        }
        return CAIRN_OK;
    case CAIRN_TYPE_F8_E4M3:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, s += 36) {
            float d;
            memcpy(&d, s, 4);
            for (int j = 0; j < 32; j++)
                dst[b * 32 + j] = d * cairn_e4m3_to_fp32(s[4 + j]);
        }
        return CAIRN_OK;
    default:
        /* Q5_0 and the K-quants (below) */
        return kquant_dequantize_row(type, src, dst, n);
    }
}

int cairn_quantize_row(int type, const float *src, void *dst, int64_t n)
{
    uint8_t *d8 = dst;
    switch (type) {
    case CAIRN_TYPE_F32:
        memcpy(dst, src, (size_t)n * 4);
        return CAIRN_OK;
    case CAIRN_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            wr16(d8 + 2 * i, cairn_fp32_to_fp16(src[i]));
        return CAIRN_OK;
    case CAIRN_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            wr16(d8 + 2 * i, cairn_fp32_to_bf16(src[i]));
        return CAIRN_OK;
    case CAIRN_TYPE_Q8_0:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, d8 += 34) {
            const float *x = src + b * 32;
            const float amax = block_amax(x);
            float d = amax / 127.0f;
            float id = d != 0 ? 1.0f / d : 0.0f;
            wr16(d8, cairn_fp32_to_fp16(d));
            for (int j = 0; j < 32; j++)
                d8[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        }
        return CAIRN_OK;
    case CAIRN_TYPE_Q4_0:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, d8 += 18) {
            const float *x = src + b * 32;
            /* The scale maps the value of largest magnitude, with its sign,
             * to -8, so the full range of the 4-bit code is used on that side. */
            float amax = 0, vmax = 0;
            for (int j = 0; j < 32; j++) {
                if (fabsf(x[j]) > amax) {
                    amax = fabsf(x[j]);
                    vmax = x[j];
                }
            }
            float d = vmax / -8.0f;
            float id = d != 0 ? 1.0f / d : 0.0f;
            wr16(d8, cairn_fp32_to_fp16(d));
            for (int j = 0; j < 16; j++) {
                int lo = (int)(x[j] * id + 8.5f);
                int hi = (int)(x[j + 16] * id + 8.5f);
                lo = lo < 0 ? 0 : lo > 15 ? 15 : lo;
                hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
                d8[2 + j] = (uint8_t)(lo | (hi << 4));
            }
        }
        return CAIRN_OK;
    case CAIRN_TYPE_MXFP4:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, d8 += 17) {
            /* the smallest power-of-two scale 2^(e - 127) that takes the
             * block's largest magnitude to at most 6 (E2M1's largest), then
             * each value to the nearest E2M1 code (ties to the lower) */
            const float *x = src + b * 32;
            const float amax = block_amax(x);
            int e = 0;
            if (amax > 0 && isfinite(amax)) {
                int ex;
                const float m = frexpf(amax / 6.0f, &ex); /* amax / 6 = m 2^ex, m in [0.5, 1) */
                e = clampi((m == 0.5f ? ex - 1 : ex) + 127, 0, 254);
            }
            d8[0] = (uint8_t)e;
            for (int j = 0; j < 32; j++) {
                const float t = ldexpf(fabsf(x[j]), 128 - e); /* twice the E2M1 value */
                int q = 0;
                for (int k = 1; k < 8; k++) /* MXFP4_TWICE[0..7] rise */
                    if (fabsf(t - (float)MXFP4_TWICE[k]) < fabsf(t - (float)MXFP4_TWICE[q]))
                        q = k;
                if (x[j] < 0 && q > 0)
                    q |= 8;
                if (j < 16)
                    d8[1 + j] = (uint8_t)q;
                else
                    d8[1 + j - 16] |= (uint8_t)(q << 4);
            }
        }
        return CAIRN_OK;
    case CAIRN_TYPE_Q4_Z:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, d8 += 20) {
            /* min/max fit: the 16 codes span [min, max], zero z the code of 0 */
            const float *x = src + b * 32;
            float lo = x[0], hi = x[0];
            for (int j = 1; j < 32; j++) {
                lo = fminf(lo, x[j]);
                hi = fmaxf(hi, x[j]);
            }
            lo = fminf(lo, 0.0f);
            hi = fmaxf(hi, 0.0f);
            const uint16_t dh = cairn_fp32_to_fp16((hi - lo) / 15.0f);
            const float d = cairn_fp16_to_fp32(dh), id = d != 0 ? 1.0f / d : 0.0f;
            const int z = clampi((int)lrintf(-lo * id), 0, 15);
            wr16(d8, dh);
            d8[2] = (uint8_t)z;
            d8[3] = 0;
            for (int j = 0; j < 16; j++) {
                const int a = clampi((int)lrintf(x[j] * id) + z, 0, 15);
                const int c = clampi((int)lrintf(x[j + 16] * id) + z, 0, 15);
                d8[4 + j] = (uint8_t)(a | (c << 4));
            }
        }
        return CAIRN_OK;
    case CAIRN_TYPE_F8_E4M3:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, d8 += 36) {
            /* the block's largest magnitude maps to 448, e4m3's largest */
            const float *x = src + b * 32;
            const float amax = block_amax(x);
            const float d = amax / 448.0f, id = d != 0 ? 1.0f / d : 0.0f;
            memcpy(d8, &d, 4);
            for (int j = 0; j < 32; j++)
                d8[4 + j] = cairn_fp32_to_e4m3(x[j] * id);
        }
        return CAIRN_OK;
    default:
        /* Q5_0 and the K-quants (below) */
        return kquant_quantize_row(type, src, dst, n);
    }
}
