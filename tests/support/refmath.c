/*
 * tests/support/refmath.c — random fills, double-precision references and
 * the tolerance checks of the kernel and GPU tests (support.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <string.h>

#include "tests/support/support.h"

void kt_fill(kt_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = kt_uniform(r, lo, hi);
}

int support_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

uint8_t *kt_random_weights(kt_rng *r, cairn_type type, int rows, int n, float lo, float hi,
                           float **values)
{
    const size_t rb = cairn_type_row_bytes(type, n);
    assert_true(rb > 0);
    uint8_t *w = kt_xmalloc(rb * (size_t)rows);
    float *f = kt_xmalloc((size_t)n * sizeof(float));
    if (values)
        *values = kt_xmalloc((size_t)rows * n * sizeof(float));
    for (int i = 0; i < rows; i++) {
        kt_fill(r, f, (size_t)n, lo, hi);
        assert_int_equal(cairn_quantize_row(type, f, w + (size_t)i * rb, n), CAIRN_OK);
        if (values)
            assert_int_equal(
                cairn_dequantize_row(type, w + (size_t)i * rb, *values + (size_t)i * n, n),
                CAIRN_OK);
    }
    free(f);
    return w;
}

void kt_quantize_act_block(const float *x, float *deq)
{
    float amax = 0.0f;
    for (int i = 0; i < 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 32; i++)
        deq[i] = d * nearbyintf(x[i] * inv); /* exact: |code| <= 127 */
}

double kt_ref_dot(const float *w, const float *x, int n, const float *w_off, double *abs_sum)
{
    double sum = 0.0, mag = 0.0;
    for (int i = 0; i < n; i++) {
        const double term = (double)w[i] * (double)x[i];
        sum += term;
        mag += w_off ? (fabs(w[i]) + w_off[i]) * fabs((double)x[i]) : fabs(term);
    }
    *abs_sum = mag;
    return sum;
}

void kt_expect_matmul(const float *got, const float *W, const float *w_off, const float *x, int T,
                      int n_in, int n_out, const char *what)
{
    for (int t = 0; t < T; t++)
        for (int o = 0; o < n_out; o++) {
            const size_t wo = (size_t)o * n_in;
            double abs_sum;
            const double sum = kt_ref_dot(W + wo, x + (size_t)t * n_in, n_in,
                                          w_off ? w_off + wo : NULL, &abs_sum);
            const double tol = (n_in + 2) * (double)FLT_EPSILON * abs_sum;
            KT_CLOSE(got[(size_t)t * n_out + o], sum, tol, what, (long long)t * n_out + o);
        }
}

double support_chi2_critical(int df)
{
    const double z = 3.0902; /* the standard normal's 0.999 quantile */
    double a = 2.0 / (9.0 * df);
    double c = 1.0 - a + z * sqrt(a);
    return df * c * c * c;
}
