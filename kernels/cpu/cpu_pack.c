/*
 * kernels/cpu/cpu_pack.c — the packed weight layout of the quantized
 * types (cpu_impl.h, "Packed weights"): its geometry, the scalar packer
 * and unpacker of one 16-row group, and the backend's weight_layout and
 * upload_weight slots, which repack a model's matrices once at load.
 *
 * Every packed byte is a GGUF byte moved (Q8_0's codes also flipped by
 * 0x80, Q5_0's fifth bits permuted): packing is a bijection on the bytes
 * that carry values, so unpacking gives back the GGUF row exactly, and
 * get_rows and the scalar reference work on packed weights through it.
 * Each type is described by a short table of column runs — "copy `width`
 * bytes at GGUF offset O of every row to packed offset P, row i at
 * P + width * i" — which the packer and the unpacker both walk, so the
 * two can never disagree.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

/* `n` columns of `width` bytes: column k takes bytes src + k * width ..
 * of each row's super-block and lies at region offset dst + k * 16 * width,
 * row i at + width * i; `flip` is XORed into every byte. `side` picks the
 * region: 0 the super-block's main region, 1 its side region. */
typedef struct {
    uint16_t dst, src;
    uint8_t width, n, side, flip;
} pack_run;

#define RUNS_MAX 5

typedef struct {
    cairn_type type;
    int sb_elems;
    int sb_bytes;     /* GGUF bytes of a super-block of one row */
    int main_bytes;   /* per super-block of a group (a multiple of 64) */
    int side_bytes;
    int n_runs;
    pack_run runs[RUNS_MAX];
    int q5_masks;     /* Q5_0: qh (GGUF offset 2) as 8 lane masks at main + 256 */
} pack_format;

/* The layouts, as documented in cpu_impl.h. */
static const pack_format formats[] = {
    {CAIRN_TYPE_Q8_0, 32, 34, 512, 32, 2,
     {{0, 2, 4, 8, 0, 0x80}, {0, 0, 2, 1, 1, 0}}, 0},
    {CAIRN_TYPE_Q4_0, 32, 18, 256, 32, 2,
     {{0, 2, 4, 4, 0, 0}, {0, 0, 2, 1, 1, 0}}, 0},
    {CAIRN_TYPE_Q5_0, 32, 22, 320, 32, 2,
     {{0, 6, 4, 4, 0, 0}, {0, 0, 2, 1, 1, 0}}, 1},
    {CAIRN_TYPE_Q4_Z, 32, 20, 256, 48, 3,
     {{0, 4, 4, 4, 0, 0}, {0, 0, 2, 1, 1, 0}, {32, 2, 1, 1, 1, 0}}, 0},
    /* MXFP4: the nibbles (GGUF offset 1) as Q4_0's, the E8M0 byte of the
     * 16 rows as one 16-byte column in the side region */
    {CAIRN_TYPE_MXFP4, 32, 17, 256, 16, 2,
     {{0, 1, 4, 4, 0, 0}, {0, 0, 1, 1, 1, 0}}, 0},
    {CAIRN_TYPE_Q4_K, 256, 144, 2304, 0, 4,
     {{0, 16, 4, 32, 0, 0}, {2048, 0, 2, 1, 0, 0}, {2080, 2, 2, 1, 0, 0}, {2112, 4, 4, 3, 0, 0}},
     0},
    {CAIRN_TYPE_Q5_K, 256, 176, 2816, 0, 5,
     {{0, 48, 4, 32, 0, 0}, {2048, 16, 4, 8, 0, 0}, {2560, 0, 2, 1, 0, 0},
      {2592, 2, 2, 1, 0, 0}, {2624, 4, 4, 3, 0, 0}},
     0},
    /* F16, BF16: elements 2p, 2p+1 of the 16 rows as column vector p of each
     * 32-element block */
    {CAIRN_TYPE_F16, 32, 64, 1024, 0, 1, {{0, 0, 4, 16, 0, 0}}, 0},
    {CAIRN_TYPE_BF16, 32, 64, 1024, 0, 1, {{0, 0, 4, 16, 0, 0}}, 0},
    {CAIRN_TYPE_Q6_K, 256, 210, 3328, 32, 4,
     {{0, 0, 4, 32, 0, 0}, {2048, 128, 4, 16, 0, 0}, {3072, 192, 1, 16, 0, 0},
      {0, 208, 2, 1, 1, 0}},
     0},
};

static const pack_format *format_of(cairn_type type)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i].type == type)
            return &formats[i];
    return NULL;
}

int cpu_pack_geom_init(cpu_pack_geom *g, cairn_type type, int n_in)
{
    const pack_format *f = format_of(type);
    if (!f || n_in <= 0 || n_in % f->sb_elems != 0)
        return 0;
    g->type = type;
    g->sb_elems = f->sb_elems;
    g->nsb = n_in / f->sb_elems;
    g->main_bytes = (size_t)f->main_bytes;
    g->side_bytes = (size_t)f->side_bytes;
    g->side_off = (size_t)g->nsb * g->main_bytes;
    const size_t raw = g->side_off + (size_t)g->nsb * g->side_bytes;
    g->group_bytes = (raw + 63) & ~(size_t)63;
    g->row_bytes = (size_t)g->nsb * (size_t)f->sb_bytes;
    return 1;
}

size_t cpu_packed_bytes(cairn_type type, int n_in, int n_out)
{
    cpu_pack_geom g;
    if (n_out <= 0 || !cpu_pack_geom_init(&g, type, n_in))
        return 0;
    return (size_t)((n_out + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS) * g.group_bytes;
}

/* Address of a run's column k, row i, in super-block sb of a group. */
static inline uint8_t *run_at(const cpu_pack_geom *g, uint8_t *group, const pack_run *r, int sb,
                              int k, int i)
{
    uint8_t *region = r->side ? group + g->side_off + (size_t)sb * g->side_bytes
                              : group + (size_t)sb * g->main_bytes;
    return region + r->dst + (size_t)k * CPU_PACK_ROWS * r->width + (size_t)r->width * i;
}

/* Copy one column run of one row: n columns of `width` bytes from src
 * (consecutive) to dst (16 * width apart), XORed with flip. Widths are 1, 2
 * or 4, each copied as one load and store. */
static inline void copy_run(uint8_t *dst, const uint8_t *src, int width, int n, uint8_t flip)
{
    const size_t stride = (size_t)CPU_PACK_ROWS * (size_t)width;
    if (width == 4) {
        const uint32_t f = flip * 0x01010101u;
        for (int k = 0; k < n; k++) {
            uint32_t v;
            memcpy(&v, src + 4 * k, 4);
            v ^= f;
            memcpy(dst + stride * (size_t)k, &v, 4);
        }
    } else if (width == 2) {
        for (int k = 0; k < n; k++) {
            dst[stride * (size_t)k] = src[2 * k] ^ flip;
            dst[stride * (size_t)k + 1] = src[2 * k + 1] ^ flip;
        }
    } else {
        for (int k = 0; k < n; k++)
            dst[stride * (size_t)k] = src[k] ^ flip;
    }
}

void cpu_pack_group(const cpu_pack_geom *g, const uint8_t *src, size_t row_stride, int rows,
                    uint8_t *group)
{
    const pack_format *f = format_of(g->type);
    if (rows > CPU_PACK_ROWS)
        rows = CPU_PACK_ROWS;
    /* rows past `rows` pack a zero row: every code and scale 0 (0x80 under
     * Q8_0's flip, as a zero row's codes should be) */
    memset(group, 0, g->group_bytes);
    for (int i = rows; i < CPU_PACK_ROWS; i++)
        for (int sb = 0; sb < g->nsb; sb++)
            for (int ri = 0; ri < f->n_runs; ri++) {
                const pack_run *r = &f->runs[ri];
                if (r->flip)
                    for (int k = 0; k < r->n; k++)
                        memset(run_at(g, group, r, sb, k, i), r->flip, r->width);
            }
    for (int i = 0; i < rows; i++) {
        const uint8_t *row = src + (size_t)i * row_stride;
        for (int sb = 0; sb < g->nsb; sb++) {
            const uint8_t *in = row + (size_t)sb * f->sb_bytes;
            for (int ri = 0; ri < f->n_runs; ri++) {
                const pack_run *r = &f->runs[ri];
                copy_run(run_at(g, group, r, sb, 0, i), in + r->src, r->width, r->n, r->flip);
            }
        }
    }
    if (f->q5_masks) {
        /* mask m, bit 4i + e = bit 4m + e of row i's qh: the fifth bit of
         * the code in byte e, lane i of code vector m (the low nibbles'
         * vectors are m = 0..3, the high nibbles' 4..7) */
        for (int sb = 0; sb < g->nsb; sb++) {
            uint64_t masks[8] = {0};
            for (int i = 0; i < rows; i++) {
                uint32_t qh;
                memcpy(&qh, src + (size_t)i * row_stride + (size_t)sb * f->sb_bytes + 2, 4);
                for (int m = 0; m < 8; m++)
                    masks[m] |= (uint64_t)((qh >> (4 * m)) & 0xf) << (4 * i);
            }
            memcpy(group + (size_t)sb * g->main_bytes + 256, masks, sizeof masks);
        }
    }
}

void cpu_unpack_row(const cpu_pack_geom *g, const uint8_t *group, int lane, uint8_t *row)
{
    const pack_format *f = format_of(g->type);
    memset(row, 0, g->row_bytes);
    for (int sb = 0; sb < g->nsb; sb++) {
        uint8_t *out = row + (size_t)sb * f->sb_bytes;
        for (int ri = 0; ri < f->n_runs; ri++) {
            const pack_run *r = &f->runs[ri];
            for (int k = 0; k < r->n; k++) {
                const uint8_t *p = run_at(g, (uint8_t *)group, r, sb, k, lane);
                for (int e = 0; e < r->width; e++)
                    out[r->src + (size_t)k * r->width + e] = p[e] ^ r->flip;
            }
        }
        if (f->q5_masks) {
            uint64_t masks[8];
            memcpy(masks, group + (size_t)sb * g->main_bytes + 256, sizeof masks);
            uint32_t qh = 0;
            for (int m = 0; m < 8; m++)
                qh |= (uint32_t)((masks[m] >> (4 * lane)) & 0xf) << (4 * m);
            memcpy(out + 2, &qh, 4);
        }
    }
}

/* ---- the backend slots ---------------------------------------------------- */

/* Whether this backend keeps `type` packed: the quantized types always (every
 * level has kernels for them), F16 and BF16 where the AVX-512 kernels run. */
static int packs(const cpu_ctx *ctx, cairn_type type)
{
    if (type == CAIRN_TYPE_F16 || type == CAIRN_TYPE_BF16)
        return ctx->isa >= CPU_ISA_AVX512;
    return cpu_q8act_type(type);
}

int cpu_weight_layout(const cairn_backend *be, cairn_type type, int n_in, int n_out,
                      size_t *bytes, cairn_type *as)
{
    if (!be || !bytes || !as || n_in <= 0 || n_out <= 0 || !cpu_type_supported(type))
        return CAIRN_EINVAL;
    const size_t packed = packs(be->ctx, type) ? cpu_packed_bytes(type, n_in, n_out) : 0;
    if (packed > 0) {
        *bytes = packed;
        *as = cpu_packed_type(type);
        return CAIRN_OK;
    }
    const size_t rb = cairn_type_row_bytes(type, n_in);
    if (rb == 0)
        return CAIRN_EINVAL;
    *bytes = rb * (size_t)n_out;
    *as = type;
    return CAIRN_OK;
}

typedef struct {
    cpu_pack_geom g;
    uint8_t *dst;
    const uint8_t *src;
    int n_out;
} pack_job;

static void pack_range(void *p, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const pack_job *job = p;
    for (int64_t grp = begin; grp < end; grp++) {
        const int64_t r = grp * CPU_PACK_ROWS;
        const int rows = job->n_out - r < CPU_PACK_ROWS ? (int)(job->n_out - r) : CPU_PACK_ROWS;
        cpu_pack_group(&job->g, job->src + (size_t)r * job->g.row_bytes, job->g.row_bytes, rows,
                       job->dst + (size_t)grp * job->g.group_bytes);
    }
}

int cpu_upload_weight(cairn_backend *be, void *dst, const void *host_src, cairn_type type,
                      int n_in, int n_out)
{
    if (!be || !dst || !host_src || n_in <= 0 || n_out <= 0 || !cpu_type_supported(type))
        return CAIRN_EINVAL;
    pack_job job = {.dst = dst, .src = host_src, .n_out = n_out};
    if (!packs(be->ctx, type) || !cpu_pack_geom_init(&job.g, type, n_in)) {
        const size_t rb = cairn_type_row_bytes(type, n_in);
        if (rb == 0)
            return CAIRN_EINVAL;
        memcpy(dst, host_src, rb * (size_t)n_out);
        return CAIRN_OK;
    }
    const int64_t groups = (n_out + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS;
    cpu_pool_parallel_for(cpu_ctx_of(be)->pool, groups, 4, pack_range, &job);
    return CAIRN_OK;
}
