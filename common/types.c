/*
 * common/types.c — element type traits (GGUF's block formats) and half
 * precision conversion.
 */
#include "common/common.h"

#include <math.h>
#include <string.h>

/* ---- type traits ------------------------------------------------------- */

/* Sizes of GGUF's block formats. Types cairn cannot compute with are still
 * listed so a file containing them parses (and is refused with a name, not
 * misread, when its tensors are used). */
static const cairn_type_traits type_table[CAIRN_TYPE_COUNT_] = {
    [CAIRN_TYPE_F32] = {"F32", 1, 4, true, false},
    [CAIRN_TYPE_F16] = {"F16", 1, 2, true, false},
    [CAIRN_TYPE_Q4_0] = {"Q4_0", 32, 18, true, false},
    [CAIRN_TYPE_Q4_1] = {"Q4_1", 32, 20, false, false},
    [CAIRN_TYPE_Q5_0] = {"Q5_0", 32, 22, true, false},
    [CAIRN_TYPE_Q5_1] = {"Q5_1", 32, 24, false, false},
    [CAIRN_TYPE_Q8_0] = {"Q8_0", 32, 34, true, false},
    [CAIRN_TYPE_Q8_1] = {"Q8_1", 32, 36, false, false},
    [CAIRN_TYPE_Q2_K] = {"Q2_K", 256, 84, false, false},
    [CAIRN_TYPE_Q3_K] = {"Q3_K", 256, 110, false, false},
    [CAIRN_TYPE_Q4_K] = {"Q4_K", 256, 144, true, false},
    [CAIRN_TYPE_Q5_K] = {"Q5_K", 256, 176, true, false},
    [CAIRN_TYPE_Q6_K] = {"Q6_K", 256, 210, true, false},
    [CAIRN_TYPE_Q8_K] = {"Q8_K", 256, 292, false, false},
    [CAIRN_TYPE_I8] = {"I8", 1, 1, false, false},
    [CAIRN_TYPE_I16] = {"I16", 1, 2, false, false},
    [CAIRN_TYPE_I32] = {"I32", 1, 4, false, false},
    [CAIRN_TYPE_I64] = {"I64", 1, 8, false, false},
    [CAIRN_TYPE_F64] = {"F64", 1, 8, false, false},
    [CAIRN_TYPE_BF16] = {"BF16", 1, 2, true, false},
    /* the CPU kernels multiply it as it is; a backend without it gets it
     * rewritten as Q5_0 at load (cairn_mxfp4_to_q5_0) */
    [CAIRN_TYPE_MXFP4] = {"MXFP4", 32, 17, true, false},
    [CAIRN_TYPE_Q4_Z] = {"Q4_Z", 32, 20, true, true},
    [CAIRN_TYPE_F8_E4M3] = {"F8_E4M3", 32, 36, true, true},
};

const cairn_type_traits *cairn_type_get(int type)
{
    if (type < 0 || type >= CAIRN_TYPE_COUNT_ || type_table[type].name == NULL)
        return NULL;
    return &type_table[type];
}

size_t cairn_type_row_bytes(int type, int64_t n)
{
    const cairn_type_traits *t = cairn_type_get(type);
    if (!t || n < 0 || n % t->block_elems != 0)
        return 0;
    return (size_t)(n / t->block_elems) * (size_t)t->block_bytes;
}

/* ---- half precision ---------------------------------------------------- */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float cairn_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf / nan */
        return bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t cairn_fp32_to_fp16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan; keep nan quiet */
        return sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0);
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return sign | 0x7c00;
    if (absx < 0x38800000u) { /* below 2^-14: subnormal half or zero */
        /* value / 2^-24, rounded to nearest even by the FPU's own rounding */
        float v = bits_f32(absx) * 0x1p24f;
        uint32_t m = (uint32_t)nearbyintf(v);
        return sign | (uint16_t)m;
    }
    uint32_t exp = (absx >> 23) - 112;
    uint32_t man = absx & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++; /* a carry into the exponent is the correct rounding */
    return sign | (uint16_t)h;
}

uint16_t cairn_fp32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---- FP8 e4m3fn ------------------------------------------------------------ */

float cairn_e4m3_to_fp32(uint8_t v)
{
    const int sign = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float x;
    if (e == 15 && m == 7)
        x = NAN;
    else if (e == 0)
        x = ldexpf((float)m, -9); /* subnormal: m * 2^-3 * 2^-6 */
    else
        x = ldexpf((float)(8 + m), e - 10); /* (1 + m/8) * 2^(e-7) */
    return sign ? -x : x;
}

uint8_t cairn_fp32_to_e4m3(float f)
{
    if (isnan(f))
        return 0x7f;
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f)
        return sign | 0x7e; /* saturate */
    /* the nearest of the 127 finite magnitudes, ties to the even code: the
     * codes are ordered by value, so a binary search over them is exact */
    int lo = 0, hi = 0x7e;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (cairn_e4m3_to_fp32((uint8_t)mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    const float dl = a - cairn_e4m3_to_fp32((uint8_t)lo), dh = cairn_e4m3_to_fp32((uint8_t)hi) - a;
    const int code = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | (uint8_t)code;
}
