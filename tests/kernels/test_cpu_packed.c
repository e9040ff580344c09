/*
 * tests/kernels/test_cpu_packed.c — the CPU backend's packed weight layout
 * (kernels/cpu/cpu_impl.h, "Packed weights") and the rule that makes every
 * quantized kernel interchangeable: for Q8_0, Q4_0, Q5_0, Q4_Z, MXFP4, Q4_K,
 * Q5_K and Q6_K,
 *
 *   - packing loses nothing: weight_layout names a packed type, and
 *     get_rows on the packed matrix gives back every row exactly as
 *     cairn_dequantize_row decodes the GGUF row (so every byte went where
 *     the unpacker looks for it), for row counts that leave a partial last
 *     group;
 *   - the scalar reference, the AVX2 kernels and the AVX-512 kernels give
 *     the same bits (cpu_impl.h at cpu_q8act_type states the one expression
 *     they all compute), on packed weights and on GGUF rows, with 1 and 3
 *     threads, for every batch size from 1 to 17 and 40 (every token tile
 *     and group pairing, partial ones included);
 *   - a token's row computed alone is the bytes of the same token in any
 *     batch: the reason decode, multi-row verification and prefill agree.
 *
 * The weight bytes are random (every code, every qh bit, every 6-bit scale
 * and min, every Q4_Z zero), with the f16 scales set to finite values and
 * MXFP4's exponents to trained weights' range, or in some rows to the
 * subnormal scales of e = 0, 1 (which every level must build alike).
 * What the kernels compute is checked against a double-precision reference
 * elsewhere (test_cpu_matmul.c, test_kquants.c, test_cpu_ckpt_types.c);
 * here the scalar level is the reference and every vector level must equal
 * it exactly. On a machine without AVX-512 (or AVX2) the CAIRN_CPU_ISA cap
 * cannot raise the level, so those rows rerun the level below.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/support/support.h"

static const cairn_type types[] = {
    CAIRN_TYPE_Q8_0, CAIRN_TYPE_Q4_0, CAIRN_TYPE_Q5_0, CAIRN_TYPE_Q4_Z,
    CAIRN_TYPE_MXFP4, CAIRN_TYPE_Q4_K, CAIRN_TYPE_Q5_K, CAIRN_TYPE_Q6_K,
};
#define N_TYPES (sizeof types / sizeof types[0])

static const char *const levels[] = {"scalar", "avx2", "avx512"};
#define N_LEVELS 3

static void put_half(uint8_t *p, float v)
{
    const uint16_t h = cairn_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* rows x n of `type` as random bytes with finite scales: every code and
 * bit pattern occurs, and the values stay small enough that no sum
 * overflows a float. */
static uint8_t *random_rows(kt_rng *r, cairn_type type, int rows, int n)
{
    const cairn_type_traits *tr = cairn_type_get(type);
    const size_t rb = cairn_type_row_bytes(type, n);
    uint8_t *W = kt_xmalloc(rb * (size_t)rows);
    for (size_t i = 0; i < rb * (size_t)rows; i++)
        W[i] = (uint8_t)kt_next(r);
    const int nblk = (int)(rb * (size_t)rows / (size_t)tr->block_bytes);
    for (int b = 0; b < nblk; b++) {
        uint8_t *blk = W + (size_t)b * (size_t)tr->block_bytes;
        const int row = b / (n / tr->block_elems);
        switch (type) {
        case CAIRN_TYPE_MXFP4:
            /* scales 2^-13 .. 2^2 (trained weights'), and every fourth
             * row all of 2^-128 .. 2^-126: the subnormal ones' results
             * are subnormal too, so no larger block hides a wrong one */
            blk[0] = (uint8_t)(row % 4 == 3 ? kt_below(r, 3) : 115 + kt_below(r, 16));
            break;
        case CAIRN_TYPE_Q6_K:
            put_half(blk + 208, kt_uniform(r, -0.01f, 0.01f));
            break;
        case CAIRN_TYPE_Q4_K:
        case CAIRN_TYPE_Q5_K:
            put_half(blk, kt_uniform(r, -0.01f, 0.01f));
            put_half(blk + 2, kt_uniform(r, -0.01f, 0.01f));
            break;
        case CAIRN_TYPE_Q4_Z:
            put_half(blk, kt_uniform(r, -0.1f, 0.1f));
            blk[3] = 0; /* the pad byte, which packing does not keep */
            break;
        default:
            put_half(blk, kt_uniform(r, -0.1f, 0.1f));
            break;
        }
    }
    return W;
}

/* The matrix in the backend's layout: backend memory and the type to pass. */
static void *packed_weight(cairn_backend *be, cairn_type type, const uint8_t *W, int n_in,
                           int n_out, cairn_type *as)
{
    size_t bytes;
    assert_int_equal(cairn_backend_weight_layout(be, type, n_in, n_out, &bytes, as), CAIRN_OK);
    void *dev = NULL;
    assert_int_equal(be->iface->alloc(be, bytes, &dev), CAIRN_OK);
    assert_int_equal(cairn_backend_upload_weight(be, dev, W, type, n_in, n_out), CAIRN_OK);
    return dev;
}

static void test_roundtrip(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("roundtrip");
    cairn_backend *be = kt_cpu(2);
    const int shapes[][2] = {{512, 37}, {256, 16}, {768, 1}, {1024, 50}};
    /* the quantized types, and F16/BF16 (packed where AVX-512 runs) */
    for (size_t ti = 0; ti < N_TYPES + 2; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const cairn_type type = ti < N_TYPES ? types[ti]
                                  : ti == N_TYPES ? CAIRN_TYPE_F16
                                                  : CAIRN_TYPE_BF16;
            const int n_in = shapes[si][0], n_out = shapes[si][1];
            uint8_t *W = random_rows(&r, type, n_out, n_in);
            cairn_type as;
            void *dev = packed_weight(be, type, W, n_in, n_out, &as);
            char what[96];
            snprintf(what, sizeof what, "get_rows %s packed n_in=%d n_out=%d",
                     cairn_type_get(type)->name, n_in, n_out);
            if (ti < N_TYPES)
                assert_true((int)as & CAIRN_TYPE_PACKED);
            assert_int_equal((int)as & ~CAIRN_TYPE_PACKED, (int)type);
            int32_t *ids = kt_xmalloc(sizeof(int32_t) * (size_t)n_out);
            for (int i = 0; i < n_out; i++)
                ids[i] = n_out - 1 - i; /* every row, in reverse */
            float *out = kt_dev(be, NULL, sizeof(float) * (size_t)n_out * (size_t)n_in);
            assert_int_equal(be->iface->get_rows(be, out, dev, as, n_in, ids, n_out), CAIRN_OK);
            float *got = kt_host(be, out, sizeof(float) * (size_t)n_out * (size_t)n_in);
            float *want = kt_xmalloc(sizeof(float) * (size_t)n_in);
            const size_t rb = cairn_type_row_bytes(type, n_in);
            for (int i = 0; i < n_out; i++) {
                assert_int_equal(cairn_dequantize_row(type, W + (size_t)ids[i] * rb, want, n_in),
                                 CAIRN_OK);
                KT_SAME_BYTES(got + (size_t)i * n_in, want, sizeof(float) * (size_t)n_in, what);
            }
            free(want);
            free(got);
            free(ids);
            be->iface->free(be, out);
            be->iface->free(be, dev);
            free(W);
        }
    cairn_backend_destroy(be);
}

/* y = x W^T on a `level` backend with `threads` threads, the weights packed
 * or in GGUF rows. */
static float *run(const char *level, int threads, int packed, cairn_type type, const uint8_t *W,
                  const float *x, int T, int n_in, int n_out)
{
    cairn_backend *be = kt_cpu_isa(level, threads, 0);
    float *y;
    if (packed) {
        cairn_type as;
        void *dev = packed_weight(be, type, W, n_in, n_out, &as);
        float *dx = kt_dev(be, x, sizeof(float) * (size_t)T * (size_t)n_in);
        float *dy = kt_dev(be, NULL, sizeof(float) * (size_t)T * (size_t)n_out);
        assert_int_equal(be->iface->matmul(be, dy, dev, as, dx, T, n_in, n_out), CAIRN_OK);
        y = kt_host(be, dy, sizeof(float) * (size_t)T * (size_t)n_out);
        be->iface->free(be, dy);
        be->iface->free(be, dx);
        be->iface->free(be, dev);
    } else {
        y = kt_run_matmul(be, type, W, cairn_type_row_bytes(type, n_in), x, T, n_in, n_out);
    }
    cairn_backend_destroy(be);
    return y;
}

static void test_levels_agree(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("levels");
    const int batch[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 40};
    const int n_outs[] = {37, 64};
    for (size_t ti = 0; ti < N_TYPES; ti++)
        for (size_t oi = 0; oi < sizeof n_outs / sizeof n_outs[0]; oi++) {
            const cairn_type type = types[ti];
            const int n_in = 512, n_out = n_outs[oi], Tmax = 40;
            uint8_t *W = random_rows(&r, type, n_out, n_in);
            float *x = kt_xmalloc(sizeof(float) * (size_t)Tmax * n_in);
            kt_fill(&r, x, (size_t)Tmax * n_in, -2.0f, 2.0f);
            /* the reference: the scalar level, one token at a time */
            float *alone = kt_xmalloc(sizeof(float) * (size_t)Tmax * n_out);
            for (int t = 0; t < Tmax; t++) {
                float *y = run("scalar", 1, 0, type, W, x + (size_t)t * n_in, 1, n_in, n_out);
                memcpy(alone + (size_t)t * n_out, y, sizeof(float) * (size_t)n_out);
                free(y);
            }
            for (size_t bi = 0; bi < sizeof batch / sizeof batch[0]; bi++)
                for (int lv = 0; lv < N_LEVELS; lv++)
                    for (int packed = 0; packed <= 1; packed++)
                        for (int threads = 1; threads <= 3; threads += 2) {
                            const int T = batch[bi];
                            /* the last T tokens, so each T starts elsewhere */
                            const float *xt = x + (size_t)(Tmax - T) * n_in;
                            float *y = run(levels[lv], threads, packed, type, W, xt, T, n_in,
                                           n_out);
                            char what[128];
                            snprintf(what, sizeof what, "%s %s %s T=%d n_out=%d threads=%d",
                                     cairn_type_get(type)->name, levels[lv],
                                     packed ? "packed" : "gguf", T, n_out, threads);
                            KT_SAME_BYTES(y, alone + (size_t)(Tmax - T) * n_out,
                                          sizeof(float) * (size_t)T * n_out, what);
                            free(y);
                        }
            free(alone);
            free(x);
            free(W);
        }
}

/* x rounded to bf16, nearest even (the activations the bf16 kernels use). */
static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* F16 and BF16 packed on an AVX-512 backend: within float rounding of the
 * double reference (for BF16 in bf16 mode, of the activations rounded to
 * bf16), and every token's row the same bytes alone and in any batch, with
 * 1 or 3 threads. BF16 runs in both modes (CAIRN_CPU_BF16=0: float FMAs). */
static void test_float_packed(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("float_packed");
    const cairn_type ftypes[] = {CAIRN_TYPE_F16, CAIRN_TYPE_BF16, CAIRN_TYPE_BF16};
    const int batch[] = {1, 2, 3, 5, 8, 9, 17};
    const int n_in = 256, n_out = 37, Tmax = 17;
    for (int fi = 0; fi < 3; fi++) {
        const cairn_type type = ftypes[fi];
        if (fi == 2)
            setenv("CAIRN_CPU_BF16", "0", 1);
        float *Wd;
        uint8_t *W = kt_random_weights(&r, type, n_out, n_in, -1, 1, &Wd);
        float *x = kt_xmalloc(sizeof(float) * (size_t)Tmax * n_in);
        kt_fill(&r, x, (size_t)Tmax * n_in, -2.0f, 2.0f);
        cairn_backend *probe = kt_cpu_isa("avx512", 1, 0);
        size_t bytes;
        cairn_type as;
        assert_int_equal(cairn_backend_weight_layout(probe, type, n_in, n_out, &bytes, &as),
                         CAIRN_OK);
        cairn_backend_destroy(probe);
        const int packed = ((int)as & CAIRN_TYPE_PACKED) != 0;
        /* the bf16 mode exists on CPUs with AVX512_BF16, unless turned off */
        const int bf16 = type == CAIRN_TYPE_BF16 && fi == 1 && packed &&
                         __builtin_cpu_supports("avx512bf16");
        float *xr = kt_xmalloc(sizeof(float) * (size_t)Tmax * n_in);
        for (int i = 0; i < Tmax * n_in; i++)
            xr[i] = bf16 ? round_bf16(x[i]) : x[i];
        float *alone = kt_xmalloc(sizeof(float) * (size_t)Tmax * n_out);
        for (int t = 0; t < Tmax; t++) {
            float *y = run("avx512", 1, 1, type, W, x + (size_t)t * n_in, 1, n_in, n_out);
            memcpy(alone + (size_t)t * n_out, y, sizeof(float) * (size_t)n_out);
            free(y);
        }
        char what[128];
        snprintf(what, sizeof what, "%s %s packed=%d", cairn_type_get(type)->name,
                 bf16 ? "bf16-dot" : "float", packed);
        kt_expect_matmul(alone, Wd, NULL, xr, Tmax, n_in, n_out, what);
        for (size_t bi = 0; bi < sizeof batch / sizeof batch[0]; bi++)
            for (int threads = 1; threads <= 3; threads += 2) {
                const int T = batch[bi];
                const float *xt = x + (size_t)(Tmax - T) * n_in;
                float *y = run("avx512", threads, 1, type, W, xt, T, n_in, n_out);
                snprintf(what, sizeof what, "%s %s T=%d threads=%d", cairn_type_get(type)->name,
                         bf16 ? "bf16-dot" : "float", T, threads);
                KT_SAME_BYTES(y, alone + (size_t)(Tmax - T) * n_out,
                              sizeof(float) * (size_t)T * n_out, what);
                free(y);
            }
        unsetenv("CAIRN_CPU_BF16");
        free(alone);
        free(xr);
        free(x);
        free(Wd);
        free(W);
    }
}

/* matmul_multi: parts of mixed quantized types (q/k/v of a Q4_K_M file),
 * packed floats, and a mix of both (one call per part then), give the
 * bytes of one matmul call per part, at several batch sizes and with 1
 * and 3 threads. */
static void test_multi(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("multi");
    const cairn_type sets[][3] = {
        {CAIRN_TYPE_Q5_0, CAIRN_TYPE_Q5_0, CAIRN_TYPE_Q8_0},
        {CAIRN_TYPE_Q4_K, CAIRN_TYPE_Q6_K, CAIRN_TYPE_Q4_0},
        {CAIRN_TYPE_BF16, CAIRN_TYPE_BF16, CAIRN_TYPE_F16},
        {CAIRN_TYPE_BF16, CAIRN_TYPE_Q8_0, CAIRN_TYPE_F32},
        /* gpt-oss: MXFP4 experts beside Q8_0 attention */
        {CAIRN_TYPE_MXFP4, CAIRN_TYPE_Q8_0, CAIRN_TYPE_MXFP4},
    };
    const int n_in = 512, n_outs[3] = {64, 37, 16};
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++)
        for (int T = 1; T <= 9; T += 4)
            for (int threads = 1; threads <= 3; threads += 2) {
                cairn_backend *be = kt_cpu(threads);
                float *x = kt_xmalloc(sizeof(float) * (size_t)T * n_in);
                kt_fill(&r, x, (size_t)T * n_in, -2.0f, 2.0f);
                float *dx = kt_dev(be, x, sizeof(float) * (size_t)T * n_in);
                cairn_matmul_part parts[3];
                float *single[3];
                void *dev[3];
                for (int i = 0; i < 3; i++) {
                    /* MXFP4 has no quantizer: random blocks */
                    uint8_t *W = sets[si][i] == CAIRN_TYPE_MXFP4
                                     ? random_rows(&r, sets[si][i], n_outs[i], n_in)
                                     : kt_random_weights(&r, sets[si][i], n_outs[i], n_in, -1, 1,
                                                         NULL);
                    cairn_type as;
                    dev[i] = packed_weight(be, sets[si][i], W, n_in, n_outs[i], &as);
                    float *dy = kt_dev(be, NULL, sizeof(float) * (size_t)T * n_outs[i]);
                    assert_int_equal(be->iface->matmul(be, dy, dev[i], as, dx, T, n_in, n_outs[i]),
                                     CAIRN_OK);
                    single[i] = kt_host(be, dy, sizeof(float) * (size_t)T * n_outs[i]);
                    be->iface->free(be, dy);
                    parts[i] = (cairn_matmul_part){
                        kt_dev(be, NULL, sizeof(float) * (size_t)T * n_outs[i]), dev[i], as,
                        n_outs[i]};
                    free(W);
                }
                assert_int_equal(cairn_backend_matmul_multi(be, dx, T, n_in, 3, parts), CAIRN_OK);
                for (int i = 0; i < 3; i++) {
                    float *got = kt_host(be, parts[i].y, sizeof(float) * (size_t)T * n_outs[i]);
                    char what[96];
                    snprintf(what, sizeof what, "multi set %zu part %d T=%d threads=%d", si, i, T,
                             threads);
                    KT_SAME_BYTES(got, single[i], sizeof(float) * (size_t)T * n_outs[i], what);
                    free(got);
                    free(single[i]);
                    be->iface->free(be, parts[i].y);
                    be->iface->free(be, dev[i]);
                }
                be->iface->free(be, dx);
                free(x);
                cairn_backend_destroy(be);
            }
}

/* A packed weight is refused where its layout does not exist, and the
 * layout slot refuses what it cannot hold. */
static void test_refusals(void **state)
{
    (void)state;
    cairn_backend *be = kt_cpu(1);
    size_t bytes;
    cairn_type as;
    /* not a whole number of super-blocks */
    assert_int_equal(cairn_backend_weight_layout(be, CAIRN_TYPE_Q4_K, 96, 4, &bytes, &as),
                     CAIRN_EINVAL);
    /* F32 keeps GGUF's layout */
    assert_int_equal(cairn_backend_weight_layout(be, CAIRN_TYPE_F32, 64, 4, &bytes, &as),
                     CAIRN_OK);
    assert_int_equal(as, CAIRN_TYPE_F32);
    assert_int_equal(bytes, (size_t)64 * 4 * 4);
    cairn_backend_destroy(be);
    /* a scalar backend keeps F16 in GGUF's layout, and refuses it marked
     * packed (it has no kernel for that layout) */
    be = kt_cpu_isa("scalar", 1, 0);
    assert_int_equal(cairn_backend_weight_layout(be, CAIRN_TYPE_F16, 64, 4, &bytes, &as),
                     CAIRN_OK);
    assert_int_equal(as, CAIRN_TYPE_F16);
    float *x = kt_dev(be, NULL, sizeof(float) * 64), *y = kt_dev(be, NULL, sizeof(float) * 4);
    void *w = kt_dev(be, NULL, 64 * 2 * 16);
    assert_int_equal(be->iface->matmul(be, y, w, (cairn_type)(CAIRN_TYPE_F16 | CAIRN_TYPE_PACKED),
                                       x, 1, 64, 4),
                     CAIRN_EINVAL);
    /* F32 has no packed layout anywhere */
    assert_int_equal(be->iface->matmul(be, y, w, (cairn_type)(CAIRN_TYPE_F32 | CAIRN_TYPE_PACKED),
                                       x, 1, 64, 4),
                     CAIRN_EINVAL);
    be->iface->free(be, w);
    be->iface->free(be, y);
    be->iface->free(be, x);
    cairn_backend_destroy(be);
}

int main(void)
{
    kt_init_seed("kernels_cpu_packed");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_levels_agree),
        cmocka_unit_test(test_float_packed),
        cmocka_unit_test(test_multi),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
