/*
 * ckpt/weights.c — a checkpoint's tensors under their GGUF names, in the
 * types cairn multiplies with.
 *
 *   model.embed_tokens.weight                 token_embd.weight
 *   model.layers.L.input_layernorm.weight     blk.L.attn_norm.weight   (F32)
 *   model.layers.L.self_attn.{q,k,v,o}_proj   blk.L.attn_{q,k,v,output}
 *   model.layers.L.self_attn.{q,k}_norm       blk.L.attn_{q,k}_norm    (F32)
 *   model.layers.L.post_attention_layernorm   blk.L.ffn_norm           (F32)
 *   model.layers.L.mlp.{gate,up,down}_proj    blk.L.ffn_{gate,up,down}
 *
 * Gemma 3 has four norms a layer, all stored as w for x * (1 + w), so 1 is
 * added here (GGUF holds 1 + w):
 *   model.layers.L.post_attention_layernorm   blk.L.post_attention_norm
 *   model.layers.L.pre_feedforward_layernorm  blk.L.ffn_norm
 *   model.layers.L.post_feedforward_layernorm blk.L.post_ffw_norm
 *
 * Mixtures of experts (Qwen2/3-MoE "mlp.", Mixtral "block_sparse_moe."):
 *   <moe>.gate                                blk.L.ffn_gate_inp       (router)
 *   mlp.experts.E.{gate,up,down}_proj         blk.L.ffn_{gate,up,down}.E
 *   block_sparse_moe.experts.E.{w1,w3,w2}     blk.L.ffn_{gate,up,down}.E
 *   mlp.shared_expert.{gate,up,down}_proj     blk.L.ffn_{gate,up,down}_shexp
 *   mlp.shared_expert_gate                    blk.L.ffn_gate_inp_shexp
 * Each expert stays its own tensor (model.c reads GGUF's per-expert names
 * as it reads the slices of a 3-D tensor), so nothing is stacked or copied.
 *   model.norm.weight                         output_norm.weight       (F32)
 *   lm_head.weight                            output.weight (absent when tied)
 *
 * gpt-oss (GptOssForCausalLM) on top of the attention's q/k/v biases:
 *   self_attn.o_proj.bias                     blk.L.attn_output.bias   (F32)
 *   self_attn.sinks [heads]                   blk.L.attn_sinks.weight  (F32)
 *   post_attention_layernorm                  blk.L.post_attention_norm (its FFN
 *                                             input norm, named as llama.cpp does)
 *   mlp.router.{weight,bias}                  blk.L.ffn_gate_inp.{weight,bias}
 *   mlp.experts.gate_up_proj_bias [E][2 eff]  blk.L.ffn_{gate,up}_exps.bias (F32)
 *   mlp.experts.down_proj_bias [E][hidden]    blk.L.ffn_down_exps.bias (F32)
 * and a layer's experts in one of two forms, both with gate and up
 * interleaved along the 2 eff axis (gate the even rows, up the odd ones):
 *   MXFP4 (quant_method mxfp4): gate_up_proj_blocks U8 [E][2 eff][hidden/32][16]
 *     and gate_up_proj_scales U8 [E][2 eff][hidden/32], down_proj_blocks
 *     [E][hidden][eff/32][16] and down_proj_scales: a block of 32 weights is
 *     one E8M0 scale byte (GGUF's too) and 16 bytes whose byte b holds
 *     element 2b in its low nibble and 2b + 1 in its high one, where GGUF's
 *     byte b holds elements b and b + 16. The nibbles are moved into
 *     GGUF's order (an exact repack) -> blk.L.ffn_{gate,up,down}_exps.weight,
 *     MXFP4 [E][out][in].
 *   float (the BF16 copies some publish): gate_up_proj [E][hidden][2 eff] and
 *     down_proj [E][eff][hidden], each expert stored input-major (x @ W):
 *     transposed into the same 3-D tensors, in the checkpoint's dtype.
 * Either way a layer's experts are a copy the handle owns (the repack, or
 * the transpose), not the mapping.
 *
 * A linear layer is one of
 *   <p>.weight                     BF16/F16/F32 [out][in]: used in place
 *   <p>.weight + weight_scale(_inv) F8_E4M3: -> F8_E4M3 blocks (repacked)
 *   <p>.qweight/qzeros/scales      AWQ: qweight I32 [in][out/8] with the
 *                                  eight nibbles of a word holding columns
 *                                  0,2,4,6,1,3,5,7 of its group of eight;
 *                                  qzeros [in/g][out/8] alike; scales F16
 *                                  [in/g][out]; w = (q - z) * s  -> Q4_Z
 *   <p>.qweight/qzeros/scales/g_idx GPTQ: qweight I32 [in/8][out] with
 *                                  nibble k of a word the input 8r+k;
 *                                  qzeros [groups][out/8] sequential, plus
 *                                  one in the v1 format; scales F16
 *                                  [groups][out]; g_idx I32 [in] the group
 *                                  of each input; w = (q - z) * s  -> Q4_Z
 *   <p>.weight_packed/weight_scale/weight_zero_point(/weight_g_idx)
 *                                  compressed-tensors pack-quantized (what
 *                                  llm-compressor's W4A16 writes): codes
 *                                  I32 [out][in/8], nibble k the input 8c+k,
 *                                  stored q + 8; scales [out][groups] in the
 *                                  model's float type (BF16 -> f16 exactly
 *                                  for scales in [2^-17, 65504]); zero
 *                                  points I32 [out/8][groups] packed along
 *                                  out, stored zp + 8, absent when
 *                                  symmetric; w = (q - zp) * s   -> Q4_Z
 * The Q4_Z and F8_E4M3 rows are [out][in/32] blocks, each carrying the
 * scale (and zero) of the group it lies in: exact, since the groups are
 * whole multiples of 32 inputs. GPTQ's act-order (a g_idx that is not
 * i / g) sorts the inputs by group (stably) and records the order as
 * "<name>.input_perm" (I32 [in]): the model gathers its input in that order
 * before the matmul.
 *
 * HF llama keeps each head's q/k rows as [first halves][second halves]
 * (rotate_half RoPE); GGUF's llama pairs adjacent rows. The rows are
 * reordered here, as the GGUF converters do, for every format: a row of
 * any cairn type is self-contained.
 */
#include "ckpt/ckpt_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const st_set *st;
    const ckpt_config *cfg;
    cairn_gguf_builder *b;
    char *err;
    size_t err_len;
    size_t repacked_bytes;
} loader;

static void free_block(void *ptr, size_t size)
{
    (void)size;
    free(ptr);
}

/* A block of n bytes the built handle will own; NULL (and *rc set) on
 * failure. */
static void *owned(loader *L, size_t n, int *rc)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        *rc = cairn_errorf(L->err, L->err_len, CAIRN_ENOMEM, "out of memory (%.1f MiB)",
                           (double)n / (1 << 20));
        return NULL;
    }
    if ((*rc = cairn_gguf_builder_keep(L->b, (cairn_gguf_keep){p, n, free_block})))
        return NULL;
    L->repacked_bytes += n;
    return p;
}

static const st_tensor *need(loader *L, const char *name, int *rc)
{
    const st_tensor *t = st_find(L->st, name);
    if (!t)
        *rc = cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT, "missing tensor '%s'", name);
    return t;
}

/* "a, b, c": a shape for a message. */
static void shape_str(char *buf, size_t n, int n_dims, const int64_t *dims)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int d = 0; d < n_dims && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%lld", d ? ", " : "", (long long)dims[d]);
}

/* Check t's shape is want[n_dims] (outermost first). */
static int check_dims(loader *L, const st_tensor *t, int n_dims, const int64_t *want)
{
    bool same = t->n_dims == n_dims;
    for (int d = 0; same && d < n_dims; d++)
        same = t->shape[d] == want[d];
    if (same)
        return CAIRN_OK;
    char got[96], implied[96];
    shape_str(got, sizeof got, t->n_dims, t->shape);
    shape_str(implied, sizeof implied, n_dims, want);
    return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                        "tensor '%s' (%s) has shape [%s], config.json implies [%s]", t->name,
                        t->file, got, implied);
}

/* Check t is [d0] (d1 == 0) or [d0][d1]. */
static int check_shape(loader *L, const st_tensor *t, int64_t d0, int64_t d1)
{
    const int64_t want[2] = {d0, d1};
    return check_dims(L, t, d1 ? 2 : 1, want);
}

static bool is_float(st_dtype t) { return t == ST_F32 || t == ST_F16 || t == ST_BF16; }

/* cairn's type of a float dtype (is_float). */
static cairn_type float_type(st_dtype t)
{
    return t == ST_BF16 ? CAIRN_TYPE_BF16 : t == ST_F16 ? CAIRN_TYPE_F16 : CAIRN_TYPE_F32;
}

/* Element e of a float tensor, whatever its alignment (the reference
 * decoder reads bytes); NaN for another dtype. */
static float float_at(const st_tensor *t, int64_t e)
{
    float f = NAN;
    if (is_float(t->dtype))
        cairn_dequantize_row(float_type(t->dtype), t->data + (size_t)e * st_dtype_size(t->dtype),
                             &f, 1);
    return f;
}

static uint32_t u32_at(const st_tensor *t, int64_t e)
{
    uint32_t v;
    memcpy(&v, t->data + (size_t)e * 4, 4);
    return v;
}

static uint16_t u16_at(const st_tensor *t, int64_t e)
{
    uint16_t v;
    memcpy(&v, t->data + (size_t)e * 2, 2);
    return v;
}

/* A 1-D float tensor (norm weight, bias) as F32 under `gname`, plus
 * `offset` (1 for Gemma's norms, which HF stores as w for x * (1 + w) and
 * GGUF as 1 + w). */
static int add_vector(loader *L, const char *hf, const char *gname, int64_t n, float offset)
{
    int rc = CAIRN_OK;
    const st_tensor *t = need(L, hf, &rc);
    if (!t)
        return rc;
    if ((rc = check_shape(L, t, n, 0)))
        return rc;
    if (!is_float(t->dtype))
        return cairn_errorf(L->err, L->err_len, CAIRN_EUNSUPPORTED, "tensor '%s' has dtype %s",
                            hf, st_dtype_name(t->dtype));
    float *v = owned(L, (size_t)n * sizeof(float), &rc);
    if (!v)
        return rc;
    cairn_dequantize_row(float_type(t->dtype), t->data, v, n);
    for (int64_t i = 0; offset != 0 && i < n; i++)
        v[i] += offset;
    const int64_t ne[1] = {n};
    return cairn_gguf_builder_add_tensor(L->b, gname, CAIRN_TYPE_F32, 1, ne, v);
}

/* The source row of destination row r: with rope_rows, HF llama's
 * rotate-half order of each head's rows (hd of them) to GGUF's adjacent
 * pairs, else r. */
static int64_t src_row(int64_t r, bool rope_rows, int hd)
{
    if (!rope_rows)
        return r;
    const int64_t h = r / hd, i = r % hd, half = hd / 2;
    return h * hd + (i % 2) * half + i / 2;
}

static int add_float_linear(loader *L, const st_tensor *t, const char *gname, int64_t n_out,
                            int64_t n_in, bool rope_rows)
{
    int rc = check_shape(L, t, n_out, n_in);
    if (rc)
        return rc;
    const cairn_type type = float_type(t->dtype);
    const int64_t ne[2] = {n_in, n_out};
    if (!rope_rows)
        return cairn_gguf_builder_add_tensor(L->b, gname, type, 2, ne, t->data);
    const size_t row = (size_t)n_in * st_dtype_size(t->dtype);
    uint8_t *w = owned(L, row * (size_t)n_out, &rc);
    if (!w)
        return rc;
    for (int64_t r = 0; r < n_out; r++)
        memcpy(w + (size_t)r * row, t->data + (size_t)src_row(r, rope_rows, L->cfg->head_dim) * row,
               row);
    return cairn_gguf_builder_add_tensor(L->b, gname, type, 2, ne, w);
}

/* ---- FP8 ------------------------------------------------------------------- */

static int add_fp8_linear(loader *L, const char *hf, const st_tensor *t, const char *gname,
                          int64_t n_out, int64_t n_in, bool rope_rows)
{
    int rc = check_shape(L, t, n_out, n_in);
    if (rc)
        return rc;
    if (n_in % 32)
        return cairn_errorf(L->err, L->err_len, CAIRN_EUNSUPPORTED,
                            "tensor '%s': FP8 rows of %lld are not a multiple of 32", t->name,
                            (long long)n_in);
    char name[512];
    const ckpt_config *c = L->cfg;
    snprintf(name, sizeof name, "%s.%s", hf, c->fp8_block ? "weight_scale_inv" : "weight_scale");
    const st_tensor *s = need(L, name, &rc);
    if (!s)
        return rc;
    if (!is_float(s->dtype))
        return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT, "tensor '%s' has dtype %s", name,
                            st_dtype_name(s->dtype));
    /* which scale covers (row, column): per tensor, per row, or per block */
    int64_t br = 0, bc = 0, n_bc = 1;
    if (c->fp8_block) {
        br = c->fp8_block_rows;
        bc = c->fp8_block_cols;
        n_bc = (n_in + bc - 1) / bc;
        if ((rc = check_shape(L, s, (n_out + br - 1) / br, n_bc)))
            return rc;
    } else if (s->n_elems != 1 && s->n_elems != n_out) {
        return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                            "tensor '%s' has %lld scales; expected 1 (per tensor) or %lld (per "
                            "output channel)", name, (long long)s->n_elems, (long long)n_out);
    }
    const int64_t nb = n_in / 32;
    uint8_t *w = owned(L, (size_t)(n_out * nb * 36), &rc);
    if (!w)
        return rc;
    for (int64_t r = 0; r < n_out; r++) {
        const int64_t sr = src_row(r, rope_rows, c->head_dim);
        const uint8_t *q = t->data + (size_t)(sr * n_in);
        for (int64_t blk = 0; blk < nb; blk++) {
            const int64_t col = blk * 32;
            float d = c->fp8_block        ? float_at(s, (sr / br) * n_bc + col / bc)
                      : s->n_elems == 1 ? float_at(s, 0)
                                        : float_at(s, sr);
            if (!isfinite(d))
                return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                                    "tensor '%s' has a scale that is not finite", name);
            uint8_t *dst = w + (size_t)((r * nb + blk) * 36);
            memcpy(dst, &d, 4);
            memcpy(dst + 4, q + col, 32);
            for (int j = 0; j < 32; j++)
                if ((q[col + j] & 0x7f) == 0x7f)
                    return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                                        "tensor '%s' holds a NaN at [%lld, %lld]", t->name,
                                        (long long)sr, (long long)(col + j));
        }
    }
    const int64_t ne[2] = {n_in, n_out};
    return cairn_gguf_builder_add_tensor(L->b, gname, CAIRN_TYPE_F8_E4M3, 2, ne, w);
}

/* ---- AWQ and GPTQ ------------------------------------------------------------ */

/* AWQ's nibble for column j of a group of eight: its packing order
 * 0,2,4,6,1,3,5,7 inverted. */
static const int AWQ_NIBBLE[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* The three 4-bit layouts, read through one accessor: the code of (input
 * i, output o), the zero and the f16 scale bits of (group k, output o). */
typedef enum { I4_AWQ, I4_GPTQ, I4_PACKED } int4_layout;

typedef struct {
    int4_layout layout;
    const st_tensor *qw, *qz, *sc; /* qz NULL: symmetric (zero 8) */
    int64_t n_in, n_out;
    bool v1_zeros;                 /* GPTQ v1: zeros stored minus one */
} int4_src;

static inline int nibble(uint32_t word, int k) { return (int)((word >> (4 * k)) & 15); }

static int int4_code(const int4_src *s, int64_t i, int64_t o)
{
    switch (s->layout) {
    case I4_AWQ: /* qweight [in][out/8], interleaved */
        return nibble(u32_at(s->qw, i * (s->n_out / 8) + o / 8), AWQ_NIBBLE[o % 8]);
    case I4_GPTQ: /* qweight [in/8][out] */
        return nibble(u32_at(s->qw, (i / 8) * s->n_out + o), (int)(i % 8));
    default: /* weight_packed [out][in/8], stored q + 8 */
        return nibble(u32_at(s->qw, o * (s->n_in / 8) + i / 8), (int)(i % 8));
    }
}

static int int4_zero(const int4_src *s, int64_t k, int64_t o, int64_t n_groups)
{
    if (!s->qz)
        return 8;
    switch (s->layout) {
    case I4_AWQ:
        return nibble(u32_at(s->qz, k * (s->n_out / 8) + o / 8), AWQ_NIBBLE[o % 8]);
    case I4_GPTQ:
        return nibble(u32_at(s->qz, k * (s->n_out / 8) + o / 8), (int)(o % 8)) +
               (s->v1_zeros ? 1 : 0);
    default: /* weight_zero_point [out/8][groups], packed along out, stored zp + 8 */
        return nibble(u32_at(s->qz, (o / 8) * n_groups + k), (int)(o % 8));
    }
}

/* The f16 bits of the scale; *exact false when a BF16 scale does not fit. */
static uint16_t int4_scale(const int4_src *s, int64_t k, int64_t o, int64_t n_groups,
                           bool *exact)
{
    if (s->layout != I4_PACKED)
        return u16_at(s->sc, k * s->n_out + o); /* scales F16 [groups][out] */
    const float f = float_at(s->sc, o * n_groups + k); /* weight_scale [out][groups] */
    const uint16_t h = cairn_fp32_to_fp16(f);
    *exact = *exact && cairn_fp16_to_fp32(h) == f;
    return h;
}

/* Bind the tensors of one 4-bit layer and check their dtypes and shapes. */
static int int4_bind(loader *L, const char *hf, int64_t n_out, int64_t n_in, int64_t n_groups,
                     int4_src *s)
{
    const ckpt_config *c = L->cfg;
    const bool packed = c->quant == QM_CT_INT4, awq = c->quant == QM_AWQ;
    *s = (int4_src){.layout = packed ? I4_PACKED : awq ? I4_AWQ : I4_GPTQ,
                    .n_in = n_in,
                    .n_out = n_out,
                    .v1_zeros = c->gptq_v1_zeros};
    char name[512];
    int rc = CAIRN_OK;
    snprintf(name, sizeof name, "%s.%s", hf, packed ? "weight_packed" : "qweight");
    if (!(s->qw = need(L, name, &rc)))
        return rc;
    snprintf(name, sizeof name, "%s.%s", hf, packed ? "weight_scale" : "scales");
    if (!(s->sc = need(L, name, &rc)))
        return rc;
    snprintf(name, sizeof name, "%s.%s", hf, packed ? "weight_zero_point" : "qzeros");
    s->qz = st_find(L->st, name);
    if (!s->qz && !(packed && c->sym))
        return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT, "missing tensor '%s'", name);
    if (s->qw->dtype != ST_I32 || (s->qz && s->qz->dtype != ST_I32) ||
        (packed ? !is_float(s->sc->dtype) : s->sc->dtype != ST_F16))
        return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                            "'%s': 4-bit codes and zeros must be I32 and scales %s (got %s, %s, %s)",
                            hf, packed ? "a float type" : "F16", st_dtype_name(s->qw->dtype),
                            s->qz ? st_dtype_name(s->qz->dtype) : "-", st_dtype_name(s->sc->dtype));
    if (packed) {
        if ((rc = check_shape(L, s->qw, n_out, n_in / 8)) ||
            (rc = check_shape(L, s->sc, n_out, n_groups)) ||
            (s->qz && (rc = check_shape(L, s->qz, n_out / 8, n_groups))))
            return rc;
        snprintf(name, sizeof name, "%s.weight_shape", hf);
        const st_tensor *ws = st_find(L->st, name);
        int64_t shape[2];
        if (ws && (ws->dtype != ST_I64 || ws->n_elems != 2 ||
                   (memcpy(shape, ws->data, 16), shape[0] != n_out || shape[1] != n_in)))
            return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                                "tensor '%s' disagrees with config.json's [%lld, %lld]", name,
                                (long long)n_out, (long long)n_in);
        return CAIRN_OK;
    }
    if ((rc = check_shape(L, s->qw, awq ? n_in : n_in / 8, awq ? n_out / 8 : n_out)) ||
        (rc = check_shape(L, s->qz, n_groups, n_out / 8)) ||
        (rc = check_shape(L, s->sc, n_groups, n_out)))
        return rc;
    return CAIRN_OK;
}

/* The group of every input (g_idx, or i / g when absent) and, when that is
 * not i / g (act-order), the inputs sorted by group (*perm, stable). */
static int input_groups(loader *L, const char *gidx_name, int64_t n_in, int64_t g,
                        int64_t n_groups, int32_t **gidx_out, int32_t **perm_out)
{
    const st_tensor *gi = gidx_name ? st_find(L->st, gidx_name) : NULL;
    int rc = CAIRN_OK;
    if (gi && (gi->dtype != ST_I32 || (rc = check_shape(L, gi, n_in, 0))))
        return rc ? rc
                  : cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT, "tensor '%s' must be I32",
                                 gidx_name);
    int32_t *gidx = malloc((size_t)n_in * sizeof *gidx);
    if (!gidx)
        return cairn_errorf(L->err, L->err_len, CAIRN_ENOMEM, "out of memory");
    bool ordered = true;
    for (int64_t i = 0; i < n_in; i++) {
        gidx[i] = gi ? (int32_t)u32_at(gi, i) : (int32_t)(i / g);
        if (gidx[i] < 0 || gidx[i] >= n_groups) {
            rc = cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                              "tensor '%s': input %lld is in group %d of %lld", gidx_name,
                              (long long)i, gidx[i], (long long)n_groups);
            free(gidx);
            return rc;
        }
        ordered = ordered && gidx[i] == (int32_t)(i / g);
    }
    *gidx_out = gidx;
    *perm_out = NULL;
    if (ordered)
        return CAIRN_OK;
    /* counting sort by group: stable, so the order is a function of g_idx */
    int64_t *start = calloc((size_t)n_groups + 1, sizeof *start);
    int32_t *perm = malloc((size_t)n_in * sizeof *perm);
    if (!start || !perm) {
        free(start);
        free(perm);
        return cairn_errorf(L->err, L->err_len, CAIRN_ENOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n_in; i++)
        start[gidx[i] + 1]++;
    for (int64_t k = 0; k < n_groups; k++)
        start[k + 1] += start[k];
    for (int64_t i = 0; i < n_in; i++)
        perm[start[gidx[i]]++] = (int32_t)i;
    free(start);
    for (int64_t j = 0; j < n_in; j += 32)
        for (int64_t k = 1; k < 32; k++)
            if (gidx[perm[j + k]] != gidx[perm[j]]) {
                free(perm);
                return cairn_errorf(L->err, L->err_len, CAIRN_EUNSUPPORTED,
                                    "'%s': act-order groups are not whole multiples of 32 inputs",
                                    gidx_name);
            }
    *perm_out = perm;
    return CAIRN_OK;
}

static int add_int4_linear(loader *L, const char *hf, const char *gname, int64_t n_out,
                           int64_t n_in, bool rope_rows)
{
    const ckpt_config *c = L->cfg;
    const int64_t g = c->group_size == -1 ? n_in : c->group_size;
    if (n_in % 32 || n_out % 8 || (c->quant == QM_AWQ && n_in % g))
        return cairn_errorf(L->err, L->err_len, CAIRN_EUNSUPPORTED,
                            "'%s': a [%lld, %lld] layer does not fit 4-bit groups of %lld", hf,
                            (long long)n_out, (long long)n_in, (long long)g);
    const int64_t n_groups = (n_in + g - 1) / g;
    int4_src src;
    int rc = int4_bind(L, hf, n_out, n_in, n_groups, &src);
    if (rc)
        return rc;
    char gidx_name[512];
    snprintf(gidx_name, sizeof gidx_name, "%s.%s", hf,
             c->quant == QM_CT_INT4 ? "weight_g_idx" : "g_idx");
    int32_t *gidx = NULL, *perm = NULL;
    if ((rc = input_groups(L, c->quant == QM_AWQ ? NULL : gidx_name, n_in, g, n_groups, &gidx,
                           &perm)))
        return rc;

    const int64_t nb = n_in / 32;
    uint8_t *w = owned(L, (size_t)(n_out * nb * 20), &rc);
    bool exact = true;
    /* input-block-major, so the rows of the codes a block reads stay in cache */
    for (int64_t blk = 0; w && blk < nb; blk++) {
        for (int64_t r = 0; r < n_out; r++) {
            const int64_t o = src_row(r, rope_rows, c->head_dim);
            const int k = gidx[perm ? perm[blk * 32] : blk * 32];
            uint8_t *dst = w + (size_t)((r * nb + blk) * 20);
            const uint16_t d = int4_scale(&src, k, o, n_groups, &exact);
            memcpy(dst, &d, 2);
            dst[2] = (uint8_t)int4_zero(&src, k, o, n_groups);
            dst[3] = 0;
            for (int j = 0; j < 16; j++) {
                const int64_t i0 = perm ? perm[blk * 32 + j] : blk * 32 + j;
                const int64_t i1 = perm ? perm[blk * 32 + j + 16] : blk * 32 + j + 16;
                dst[4 + j] = (uint8_t)(int4_code(&src, i0, o) | (int4_code(&src, i1, o) << 4));
            }
        }
    }
    free(gidx);
    if (w && !exact)
        cairn_log(CAIRN_LOG_WARN, "ckpt: '%s': some BF16 scales are rounded to F16 (below 2^-17 "
                  "or above 65504)", hf);
    const int64_t ne[2] = {n_in, n_out};
    if (w)
        rc = cairn_gguf_builder_add_tensor(L->b, gname, CAIRN_TYPE_Q4_Z, 2, ne, w);
    if (rc == CAIRN_OK && perm) {
        int32_t *kept = owned(L, (size_t)n_in * sizeof *kept, &rc);
        if (kept) {
            memcpy(kept, perm, (size_t)n_in * sizeof *kept);
            char pname[256];
            snprintf(pname, sizeof pname, "%.*s.input_perm",
                     (int)(strlen(gname) - strlen(".weight")), gname);
            const int64_t pne[1] = {n_in};
            rc = cairn_gguf_builder_add_tensor(L->b, pname, CAIRN_TYPE_I32, 1, pne, kept);
        }
    }
    free(perm);
    return rc;
}

/* One linear layer "<hf>" ([n_out][n_in]) under "<gname>" in whatever
 * format the checkpoint stores it. */
static int add_linear(loader *L, const char *hf, const char *gname, int64_t n_out, int64_t n_in,
                      bool rope_rows)
{
    char name[512];
    snprintf(name, sizeof name, "%s.weight", hf);
    const st_tensor *t = st_find(L->st, name);
    if (t && is_float(t->dtype))
        return add_float_linear(L, t, gname, n_out, n_in, rope_rows);
    if (t && t->dtype == ST_F8_E4M3 && L->cfg->quant == QM_FP8)
        return add_fp8_linear(L, hf, t, gname, n_out, n_in, rope_rows);
    if (t)
        return cairn_errorf(L->err, L->err_len, CAIRN_EUNSUPPORTED,
                            "tensor '%s' has dtype %s%s", name, st_dtype_name(t->dtype),
                            t->dtype == ST_F8_E4M3 ? " but config.json declares no FP8 quantization"
                                                   : "");
    if (L->cfg->quant == QM_AWQ || L->cfg->quant == QM_GPTQ || L->cfg->quant == QM_CT_INT4)
        return add_int4_linear(L, hf, gname, n_out, n_in, rope_rows);
    return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT, "missing tensor '%s'", name);
}

/* ---- gpt-oss's experts ---------------------------------------------------- */

/* One block of HF's MXFP4 (scale e, bytes q: element 2b and 2b + 1 in the
 * low and high nibble of q[b]) as GGUF's (element b and b + 16 in the low
 * and high nibble of byte b), at dst[0..16]. */
static void mxfp4_block(uint8_t *dst, uint8_t e, const uint8_t *q)
{
    dst[0] = e;
    for (int m = 0; m < 8; m++) {
        /* GGUF bytes 2m and 2m + 1 hold elements 2m, 2m + 1 (in q[m]) and
         * 2m + 16, 2m + 17 (in q[8 + m]) */
        dst[1 + 2 * m] = (uint8_t)((q[m] & 0x0f) | (q[8 + m] << 4));
        dst[2 + 2 * m] = (uint8_t)((q[m] >> 4) | (q[8 + m] & 0xf0));
    }
}

/* "<pre><hf>_blocks" / "_scales" (the rows of every expert: `split` GGUF
 * tensors interleaved row by row, n_in inputs each) as the MXFP4 3-D
 * tensors gname[0..split), [E][rows][n_in] each. */
static int add_mxfp4_experts(loader *L, const char *pre, const char *hf, int split, int64_t rows,
                             int64_t n_in, const char *const *gname)
{
    const int64_t E = L->cfg->n_expert, nb = n_in / 32;
    char bname[256], sname[256];
    snprintf(bname, sizeof bname, "%s%s_blocks", pre, hf);
    snprintf(sname, sizeof sname, "%s%s_scales", pre, hf);
    int rc = CAIRN_OK;
    const st_tensor *qb = need(L, bname, &rc), *sc = qb ? need(L, sname, &rc) : NULL;
    if (!sc)
        return rc;
    if (n_in % 32)
        return cairn_errorf(L->err, L->err_len, CAIRN_EUNSUPPORTED,
                            "tensor '%s': MXFP4 rows of %lld inputs are not whole blocks of 32",
                            bname, (long long)n_in);
    if (qb->dtype != ST_U8 || sc->dtype != ST_U8)
        return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                            "tensors '%s' and '%s': MXFP4 blocks and scales must be U8 (got %s, "
                            "%s)", bname, sname, st_dtype_name(qb->dtype),
                            st_dtype_name(sc->dtype));
    const int64_t bdims[4] = {E, rows * split, nb, 16};
    if ((rc = check_dims(L, qb, 4, bdims)) || (rc = check_dims(L, sc, 3, bdims)))
        return rc;
    const size_t expert_bytes = (size_t)(rows * nb * 17);
    for (int s = 0; s < split; s++) {
        uint8_t *w = owned(L, expert_bytes * (size_t)E, &rc);
        if (!w)
            return rc;
        for (int64_t e = 0; e < E; e++)
            for (int64_t r = 0; r < rows; r++) {
                const int64_t src = (e * rows + r) * split + s; /* the HF row */
                uint8_t *dst = w + (size_t)e * expert_bytes + (size_t)(r * nb * 17);
                for (int64_t k = 0; k < nb; k++) {
                    const uint8_t ex = sc->data[src * nb + k];
                    /* E8M0's one NaN: no weight of the block means anything */
                    if (ex == 0xff)
                        return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                                            "tensor '%s' holds a NaN scale (0xff) at [%lld, %lld, "
                                            "%lld]", sname, (long long)e,
                                            (long long)(r * split + s), (long long)k);
                    mxfp4_block(dst + k * 17, ex, qb->data + (size_t)(src * nb + k) * 16);
                }
            }
        const int64_t ne[3] = {n_in, rows, E};
        if ((rc = cairn_gguf_builder_add_tensor(L->b, gname[s], CAIRN_TYPE_MXFP4, 3, ne, w)))
            return rc;
    }
    return CAIRN_OK;
}

/* Rows [r0, r1) and inputs [i0, i1) of one expert's tensor s: dst [rows][n_in]
 * from src [n_in][cols], elements of es bytes (a constant where it is
 * called, so each copy is one load and store). */
static inline void copy_tile(uint8_t *dst, const uint8_t *src, int64_t n_in, int64_t cols,
                             int split, int s, int64_t r0, int64_t r1, int64_t i0, int64_t i1,
                             size_t es)
{
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = i0; i < i1; i++)
            memcpy(dst + (size_t)(r * n_in + i) * es, src + (size_t)(i * cols + r * split + s) * es,
                   es);
}

/* "<pre><hf>" in a float dtype, [E][n_in][rows * split] (x @ W, the input
 * outermost), as the 3-D tensors gname[0..split) in the same dtype,
 * [E][rows][n_in] each: column r * split + s becomes row r of tensor s. */
static int add_float_experts(loader *L, const char *pre, const char *hf, int split, int64_t rows,
                             int64_t n_in, const char *const *gname)
{
    const int64_t E = L->cfg->n_expert, cols = rows * split;
    char name[256];
    snprintf(name, sizeof name, "%s%s", pre, hf);
    int rc = CAIRN_OK;
    const st_tensor *t = st_find(L->st, name);
    if (!t)
        return cairn_errorf(L->err, L->err_len, CAIRN_EFORMAT,
                            "missing tensor '%s_blocks' (MXFP4 experts) or '%s' (float experts)",
                            name, name);
    if (!is_float(t->dtype))
        return cairn_errorf(L->err, L->err_len, CAIRN_EUNSUPPORTED, "tensor '%s' has dtype %s",
                            name, st_dtype_name(t->dtype));
    const int64_t dims[3] = {E, n_in, cols};
    if ((rc = check_dims(L, t, 3, dims)))
        return rc;
    const size_t es = st_dtype_size(t->dtype);
    enum { TILE = 64 }; /* a tile of rows and inputs: both sides stay in cache */
    for (int s = 0; s < split; s++) {
        uint8_t *w = owned(L, (size_t)(E * rows * n_in) * es, &rc);
        if (!w)
            return rc;
        for (int64_t e = 0; e < E; e++) {
            const uint8_t *src = t->data + (size_t)(e * n_in * cols) * es;
            uint8_t *dst = w + (size_t)(e * rows * n_in) * es;
            for (int64_t i0 = 0; i0 < n_in; i0 += TILE)
                for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
                    const int64_t i1 = i0 + TILE < n_in ? i0 + TILE : n_in;
                    const int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
                    if (es == 2)
                        copy_tile(dst, src, n_in, cols, split, s, r0, r1, i0, i1, 2);
                    else
                        copy_tile(dst, src, n_in, cols, split, s, r0, r1, i0, i1, 4);
                }
        }
        const int64_t ne[3] = {n_in, rows, E};
        if ((rc = cairn_gguf_builder_add_tensor(L->b, gname[s], float_type(t->dtype), 3, ne, w)))
            return rc;
    }
    return CAIRN_OK;
}

/* "<pre><hf>" [E][n * split], a float bias per expert, as the F32 tensors
 * gname[0..split) [E][n]: element k * split + s of an expert's row is
 * element k of tensor s. */
static int add_expert_biases(loader *L, const char *pre, const char *hf, int split, int64_t n,
                             const char *const *gname)
{
    const int64_t E = L->cfg->n_expert;
    char name[256];
    snprintf(name, sizeof name, "%s%s", pre, hf);
    int rc = CAIRN_OK;
    const st_tensor *t = need(L, name, &rc);
    if (!t)
        return rc;
    if ((rc = check_shape(L, t, E, n * split)))
        return rc;
    if (!is_float(t->dtype))
        return cairn_errorf(L->err, L->err_len, CAIRN_EUNSUPPORTED, "tensor '%s' has dtype %s",
                            name, st_dtype_name(t->dtype));
    float *all = malloc((size_t)(E * n * split) * sizeof *all);
    if (!all)
        return cairn_errorf(L->err, L->err_len, CAIRN_ENOMEM, "out of memory");
    cairn_dequantize_row(float_type(t->dtype), t->data, all, E * n * split);
    for (int s = 0; s < split && rc == CAIRN_OK; s++) {
        float *v = owned(L, (size_t)(E * n) * sizeof *v, &rc);
        for (int64_t j = 0; v && j < E * n; j++)
            v[j] = all[j * split + s];
        const int64_t ne[2] = {n, E};
        if (v)
            rc = cairn_gguf_builder_add_tensor(L->b, gname[s], CAIRN_TYPE_F32, 2, ne, v);
    }
    free(all);
    return rc;
}

/* Layer l's experts and their biases (the table at the top). */
static int add_oss_experts(loader *L, const char *base, int l)
{
    const ckpt_config *c = L->cfg;
    const int64_t dim = c->dim, eff = c->expert_ffn;
    char pre[160], name[224];
    char g[6][64];
    static const char *const what[6] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                        "ffn_down_exps.weight", "ffn_gate_exps.bias",
                                        "ffn_up_exps.bias", "ffn_down_exps.bias"};
    for (int k = 0; k < 6; k++)
        snprintf(g[k], sizeof g[k], "blk.%d.%s", l, what[k]);
    const char *const gate_up[2] = {g[0], g[1]}, *const down[1] = {g[2]};
    const char *const gate_up_b[2] = {g[3], g[4]}, *const down_b[1] = {g[5]};
    snprintf(pre, sizeof pre, "%s.layers.%d.mlp.experts.", base, l);
    snprintf(name, sizeof name, "%sgate_up_proj_blocks", pre);
    const bool mx = st_find(L->st, name) != NULL;
    if (mx && c->quant != QM_MXFP4)
        return cairn_errorf(L->err, L->err_len, CAIRN_EUNSUPPORTED,
                            "tensor '%s' is MXFP4 but config.json declares no mxfp4 "
                            "quantization", name);
    int rc;
    if (mx) {
        if ((rc = add_mxfp4_experts(L, pre, "gate_up_proj", 2, eff, dim, gate_up)) ||
            (rc = add_mxfp4_experts(L, pre, "down_proj", 1, dim, eff, down)))
            return rc;
    } else if ((rc = add_float_experts(L, pre, "gate_up_proj", 2, eff, dim, gate_up)) ||
               (rc = add_float_experts(L, pre, "down_proj", 1, dim, eff, down))) {
        return rc;
    }
    if ((rc = add_expert_biases(L, pre, "gate_up_proj_bias", 2, eff, gate_up_b)))
        return rc;
    return add_expert_biases(L, pre, "down_proj_bias", 1, dim, down_b);
}

/* Llama 3's RoPE scaling as GGUF's rope_freqs tensor: one divisor per
 * frequency, 1 for the fast ones, `factor` for the slow ones, and a smooth
 * blend between the two wavelengths. */
static int add_llama3_rope_freqs(loader *L)
{
    const ckpt_config *c = L->cfg;
    const int half = c->head_dim / 2;
    int rc = CAIRN_OK;
    float *f = owned(L, (size_t)half * sizeof *f, &rc);
    if (!f)
        return rc;
    const double lo_wavelen = c->rope_orig_ctx / c->rope_low_freq;
    const double hi_wavelen = c->rope_orig_ctx / c->rope_high_freq;
    for (int i = 0; i < half; i++) {
        const double freq = 1.0 / pow(c->rope_theta, 2.0 * i / c->head_dim);
        const double wavelen = 2 * M_PI / freq;
        if (wavelen < hi_wavelen)
            f[i] = 1.0f;
        else if (wavelen > lo_wavelen)
            f[i] = c->rope_factor;
        else {
            const double smooth = (c->rope_orig_ctx / wavelen - c->rope_low_freq) /
                                  (c->rope_high_freq - c->rope_low_freq);
            f[i] = (float)(1.0 / ((1 - smooth) / c->rope_factor + smooth));
        }
    }
    const int64_t ne[1] = {half};
    return cairn_gguf_builder_add_tensor(L->b, "rope_freqs.weight", CAIRN_TYPE_F32, 1, ne, f);
}

int ckpt_weights_add(const st_set *s, const ckpt_config *cfg, cairn_gguf_builder *b, char *err,
                     size_t err_len)
{
    const double t0 = cairn_now();
    loader L = {s, cfg, b, err, err_len, 0};
    const int64_t dim = cfg->dim, hd = cfg->head_dim, ffn = cfg->ffn;
    const int64_t q_dim = (int64_t)cfg->n_head * hd, kv_dim = (int64_t)cfg->n_kv * hd;
    const int llama = cfg->llama_rope;
    const bool oss = cfg->oss;
    const bool biases = strncmp(cfg->arch, "qwen2", 5) == 0 || oss; /* qwen2(moe), gpt-oss */
    const bool qk_norm = cfg->gemma || strncmp(cfg->arch, "qwen3", 5) == 0;
    const bool dense = cfg->n_expert == 0;
    const float norm_offset = cfg->gemma ? 1.0f : 0.0f;
    int rc = CAIRN_OK;

    /* Where the language model's tensors are: "model." in a ...ForCausalLM;
     * a multimodal checkpoint (Gemma3ForConditionalGeneration) keeps them
     * under "model.language_model." (transformers >= 4.52) or
     * "language_model.model." (before), its lm_head beside them, and its
     * vision tower elsewhere (not read). */
    static const char *const bases[][2] = {{"model", "lm_head"},
                                           {"model.language_model", "lm_head"},
                                           {"language_model.model", "language_model.lm_head"}};
    const char *base = bases[0][0], *head = bases[0][1];
    char name[192];
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        snprintf(name, sizeof name, "%s.embed_tokens.weight", bases[i][0]);
        if (st_find(s, name)) {
            base = bases[i][0];
            head = bases[i][1];
            break;
        }
    }
    /* the embedding table stays a float table: it is looked up, not multiplied */
    snprintf(name, sizeof name, "%s.embed_tokens.weight", base);
    const st_tensor *emb = need(&L, name, &rc);
    if (!emb)
        return rc;
    if (!is_float(emb->dtype))
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "%s has dtype %s (a float type expected)", name,
                            st_dtype_name(emb->dtype));
    if ((rc = add_float_linear(&L, emb, "token_embd.weight", cfg->n_vocab, dim, 0)))
        return rc;
    snprintf(name, sizeof name, "%s.norm.weight", base);
    if ((rc = add_vector(&L, name, "output_norm.weight", dim, norm_offset)))
        return rc;
    char head_w[96], head_q[96];
    snprintf(head_w, sizeof head_w, "%s.weight", head);
    snprintf(head_q, sizeof head_q, "%s.qweight", head);
    if (st_find(s, head_w) || st_find(s, head_q)) {
        if ((rc = add_linear(&L, head, "output.weight", cfg->n_vocab, dim, 0)))
            return rc;
    } else if (!cfg->tied) {
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "no lm_head.weight, and config.json does not tie it to the embeddings");
    }
    if (cfg->llama3_rope && (rc = add_llama3_rope_freqs(&L)))
        return rc;

    for (int l = 0; l < cfg->n_layer && rc == CAIRN_OK; l++) {
        char hf[160], g[96];
        const struct {
            const char *hf, *gguf;
            int64_t n_out, n_in;
            bool rope_rows; /* HF llama's q/k: rows reordered to GGUF's RoPE pairs */
            bool wanted;
        } lin[] = {
            {"self_attn.q_proj", "attn_q", q_dim, dim, llama, true},
            {"self_attn.k_proj", "attn_k", kv_dim, dim, llama, true},
            {"self_attn.v_proj", "attn_v", kv_dim, dim, false, true},
            {"self_attn.o_proj", "attn_output", dim, q_dim, false, true},
            {"mlp.gate_proj", "ffn_gate", ffn, dim, false, dense},
            {"mlp.up_proj", "ffn_up", ffn, dim, false, dense},
            {"mlp.down_proj", "ffn_down", dim, ffn, false, dense},
            /* qwen2moe's shared expert and its gate, a [1][dim] matrix */
            {"mlp.shared_expert.gate_proj", "ffn_gate_shexp", cfg->shared_ffn, dim, false,
             cfg->shared_ffn > 0},
            {"mlp.shared_expert.up_proj", "ffn_up_shexp", cfg->shared_ffn, dim, false,
             cfg->shared_ffn > 0},
            {"mlp.shared_expert.down_proj", "ffn_down_shexp", dim, cfg->shared_ffn, false,
             cfg->shared_ffn > 0},
            {"mlp.shared_expert_gate", "ffn_gate_inp_shexp", 1, dim, false, cfg->shared_ffn > 0},
            /* the router */
            {cfg->mixtral ? "block_sparse_moe.gate" : oss ? "mlp.router" : "mlp.gate",
             "ffn_gate_inp", cfg->n_expert, dim, false, !dense},
        };
        for (size_t i = 0; i < sizeof lin / sizeof lin[0] && rc == CAIRN_OK; i++) {
            if (!lin[i].wanted)
                continue;
            snprintf(hf, sizeof hf, "%s.layers.%d.%s", base, l, lin[i].hf);
            snprintf(g, sizeof g, "blk.%d.%s.weight", l, lin[i].gguf);
            rc = add_linear(&L, hf, g, lin[i].n_out, lin[i].n_in, lin[i].rope_rows);
        }
        /* every expert's gate, up and down under GGUF's per-expert names */
        static const char *const qwen_proj[3] = {"gate_proj", "up_proj", "down_proj"};
        static const char *const mixtral_proj[3] = {"w1", "w3", "w2"};
        static const char *const gguf_proj[3] = {"ffn_gate", "ffn_up", "ffn_down"};
        const int64_t eff = cfg->expert_ffn;
        if (oss && rc == CAIRN_OK) /* stacked, not one tensor per expert */
            rc = add_oss_experts(&L, base, l);
        for (int e = 0; e < (oss ? 0 : cfg->n_expert) && rc == CAIRN_OK; e++)
            for (int k = 0; k < 3 && rc == CAIRN_OK; k++) {
                snprintf(hf, sizeof hf, "%s.layers.%d.%s.experts.%d.%s", base, l,
                         cfg->mixtral ? "block_sparse_moe" : "mlp", e,
                         cfg->mixtral ? mixtral_proj[k] : qwen_proj[k]);
                snprintf(g, sizeof g, "blk.%d.%s.%d.weight", l, gguf_proj[k], e);
                rc = add_linear(&L, hf, g, k == 2 ? dim : eff, k == 2 ? eff : dim, false);
            }
        const struct {
            const char *hf, *gguf;
            int64_t n;
            bool wanted;
        } vec[] = {
            {"input_layernorm.weight", "attn_norm.weight", dim, true},
            /* Gemma: norms before and after both the attention and the FFN */
            {"post_attention_layernorm.weight",
             cfg->gemma || oss ? "post_attention_norm.weight" : "ffn_norm.weight", dim, true},
            {"pre_feedforward_layernorm.weight", "ffn_norm.weight", dim, cfg->gemma},
            {"post_feedforward_layernorm.weight", "post_ffw_norm.weight", dim, cfg->gemma},
            {"self_attn.q_proj.bias", "attn_q.bias", q_dim, biases},
            {"self_attn.k_proj.bias", "attn_k.bias", kv_dim, biases},
            {"self_attn.v_proj.bias", "attn_v.bias", kv_dim, biases},
            {"self_attn.q_norm.weight", "attn_q_norm.weight", hd, qk_norm},
            {"self_attn.k_norm.weight", "attn_k_norm.weight", hd, qk_norm},
            {"self_attn.o_proj.bias", "attn_output.bias", dim, oss},
            {"self_attn.sinks", "attn_sinks.weight", cfg->n_head, oss},
            {"mlp.router.bias", "ffn_gate_inp.bias", cfg->n_expert, oss},
        };
        for (size_t i = 0; i < sizeof vec / sizeof vec[0] && rc == CAIRN_OK; i++) {
            if (!vec[i].wanted)
                continue;
            snprintf(hf, sizeof hf, "%s.layers.%d.%s", base, l, vec[i].hf);
            snprintf(g, sizeof g, "blk.%d.%s", l, vec[i].gguf);
            const bool is_norm = strstr(vec[i].gguf, "norm") != NULL;
            rc = add_vector(&L, hf, g, vec[i].n, is_norm ? norm_offset : 0.0f);
        }
    }
    if (rc == CAIRN_OK && L.repacked_bytes > ((size_t)64 << 20))
        cairn_log(CAIRN_LOG_INFO, "ckpt: repacked %.1f MiB of weights in %.2f s",
                  (double)L.repacked_bytes / (1 << 20), cairn_now() - t0);
    return rc;
}
