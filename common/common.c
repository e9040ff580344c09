/*
 * common/common.c — status strings, element type traits and the reference
 * (de)quantizers, half precision, logging.
 */
#include "common/common.h"
#include "common/quant_k_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *cairn_strerror(int status)
{
    switch (status) {
    case CAIRN_OK: return "ok";
    case CAIRN_EINVAL: return "invalid argument";
    case CAIRN_ENOMEM: return "out of memory";
    case CAIRN_EIO: return "I/O error";
    case CAIRN_EFORMAT: return "malformed or corrupt data";
    case CAIRN_EUNSUPPORTED: return "not supported";
    case CAIRN_ENOTFOUND: return "not found";
    case CAIRN_ERANGE: return "out of range or buffer too small";
    case CAIRN_EFULL: return "no capacity left";
    case CAIRN_EBUSY: return "in use";
    case CAIRN_ECORRUPT: return "stored data failed verification";
    case CAIRN_EBACKEND: return "compute backend error";
    case CAIRN_ECLOSED: return "closed";
    case CAIRN_EPERM: return "not authenticated or not permitted";
    default: return "unknown error";
    }
}

int cairn_errorf(char *err, size_t err_len, int rc, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* ---- type traits ------------------------------------------------------- */

/* Sizes of GGUF's block formats. Types cairn cannot compute with are still
 * listed so a file containing them parses (and is refused with a name, not
 * misread, when its tensors are used). */
static const cairn_type_traits type_table[CAIRN_TYPE_COUNT_] = {
    [CAIRN_TYPE_F32] = {"F32", 1, 4, true},
    [CAIRN_TYPE_F16] = {"F16", 1, 2, true},
    [CAIRN_TYPE_Q4_0] = {"Q4_0", 32, 18, true},
    [CAIRN_TYPE_Q4_1] = {"Q4_1", 32, 20, false},
    [CAIRN_TYPE_Q5_0] = {"Q5_0", 32, 22, true},
    [CAIRN_TYPE_Q5_1] = {"Q5_1", 32, 24, false},
    [CAIRN_TYPE_Q8_0] = {"Q8_0", 32, 34, true},
    [CAIRN_TYPE_Q8_1] = {"Q8_1", 32, 36, false},
    [CAIRN_TYPE_Q2_K] = {"Q2_K", 256, 84, false},
    [CAIRN_TYPE_Q3_K] = {"Q3_K", 256, 110, false},
    [CAIRN_TYPE_Q4_K] = {"Q4_K", 256, 144, true},
    [CAIRN_TYPE_Q5_K] = {"Q5_K", 256, 176, true},
    [CAIRN_TYPE_Q6_K] = {"Q6_K", 256, 210, true},
    [CAIRN_TYPE_Q8_K] = {"Q8_K", 256, 292, false},
    [CAIRN_TYPE_I8] = {"I8", 1, 1, false},
    [CAIRN_TYPE_I16] = {"I16", 1, 2, false},
    [CAIRN_TYPE_I32] = {"I32", 1, 4, false},
    [CAIRN_TYPE_I64] = {"I64", 1, 8, false},
    [CAIRN_TYPE_F64] = {"F64", 1, 8, false},
    [CAIRN_TYPE_BF16] = {"BF16", 1, 2, true},
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

/* ---- reference (de)quantization ---------------------------------------- */

static inline uint16_t read_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline void write_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

int cairn_dequantize_row(int type, const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    switch (type) {
    case CAIRN_TYPE_F32:
        memcpy(dst, src, (size_t)n * 4);
        return CAIRN_OK;
    case CAIRN_TYPE_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = cairn_fp16_to_fp32(read_u16(s + 2 * i));
        return CAIRN_OK;
    case CAIRN_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = cairn_bf16_to_fp32(read_u16(s + 2 * i));
        return CAIRN_OK;
    case CAIRN_TYPE_Q8_0:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, s += 34) {
            float d = cairn_fp16_to_fp32(read_u16(s));
            for (int j = 0; j < 32; j++)
                dst[b * 32 + j] = d * (float)(int8_t)s[2 + j];
        }
        return CAIRN_OK;
    case CAIRN_TYPE_Q4_0:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, s += 18) {
            float d = cairn_fp16_to_fp32(read_u16(s));
            for (int j = 0; j < 16; j++) {
                dst[b * 32 + j] = d * (float)((s[2 + j] & 0x0f) - 8);
                dst[b * 32 + j + 16] = d * (float)((s[2 + j] >> 4) - 8);
            }
        }
        return CAIRN_OK;
    default:
        /* Q5_0 and the K-quants (quant_k.c) */
        return quantk_dequantize_row(type, src, dst, n);
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
            write_u16(d8 + 2 * i, cairn_fp32_to_fp16(src[i]));
        return CAIRN_OK;
    case CAIRN_TYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            write_u16(d8 + 2 * i, cairn_fp32_to_bf16(src[i]));
        return CAIRN_OK;
    case CAIRN_TYPE_Q8_0:
        if (n % 32)
            return CAIRN_EINVAL;
        for (int64_t b = 0; b < n / 32; b++, d8 += 34) {
            const float *x = src + b * 32;
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[j]));
            float d = amax / 127.0f;
            float id = d != 0 ? 1.0f / d : 0.0f;
            write_u16(d8, cairn_fp32_to_fp16(d));
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
            write_u16(d8, cairn_fp32_to_fp16(d));
            for (int j = 0; j < 16; j++) {
                int lo = (int)(x[j] * id + 8.5f);
                int hi = (int)(x[j + 16] * id + 8.5f);
                lo = lo < 0 ? 0 : lo > 15 ? 15 : lo;
                hi = hi < 0 ? 0 : hi > 15 ? 15 : hi;
                d8[2 + j] = (uint8_t)(lo | (hi << 4));
            }
        }
        return CAIRN_OK;
    default:
        /* Q5_0 and the K-quants (quant_k.c) */
        return quantk_quantize_row(type, src, dst, n);
    }
}

/* ---- logging ----------------------------------------------------------- */

static atomic_int log_level = CAIRN_LOG_INFO;

void cairn_log_set_level(cairn_log_level level)
{
    atomic_store(&log_level, (int)level);
}

void cairn_log(cairn_log_level level, const char *fmt, ...)
{
    if ((int)level > atomic_load(&log_level))
        return;
    static const char *tag[] = {"error", "warn", "info", "debug"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cairn: %s: %s\n", tag[level], line);
}

double cairn_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- growing strings ------------------------------------------------------ */

void cairn_strbuf_add(cairn_strbuf *b, const void *s, size_t n)
{
    if (b->oom || n == 0) /* n == 0: data may still be NULL (NULL + 0 is UB) */
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->oom = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void cairn_strbuf_free(cairn_strbuf *b)
{
    free(b->data);
    *b = (cairn_strbuf){0};
}
