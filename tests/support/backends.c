/*
 * tests/support/backends.c — host and backend buffers and the backends of
 * the kernel and GPU tests (support.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include <string.h>

#include "tests/support/support.h"

void *kt_xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    assert_non_null(p);
    return p;
}

void *kt_dev(cairn_backend *be, const void *host, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(be->iface->alloc(be, bytes, &p), CAIRN_OK);
    if (host)
        assert_int_equal(be->iface->upload(be, p, host, bytes), CAIRN_OK);
    return p;
}

void *kt_host(cairn_backend *be, const void *dev, size_t bytes)
{
    void *h = kt_xmalloc(bytes);
    assert_int_equal(be->iface->download(be, h, dev, bytes), CAIRN_OK);
    return h;
}

cairn_backend *kt_cpu(int n_threads)
{
    cairn_backend *be = NULL;
    assert_int_equal(cairn_backend_cpu_create(n_threads, &be), CAIRN_OK);
    assert_non_null(be);
    return be;
}

cairn_backend *kt_cpu_isa(const char *isa, int threads, int exact)
{
    setenv("CAIRN_CPU_ISA", isa, 1);
    if (exact)
        setenv("CAIRN_CPU_EXACT_MATMUL", "1", 1);
    cairn_backend *be = kt_cpu(threads);
    unsetenv("CAIRN_CPU_ISA");
    unsetenv("CAIRN_CPU_EXACT_MATMUL");
    return be;
}

float *kt_run_matmul(cairn_backend *be, cairn_type type, const uint8_t *W, size_t rb,
                     const float *x, int T, int n_in, int n_out)
{
    const size_t y_bytes = sizeof(float) * (size_t)T * (size_t)n_out;
    void *dW = kt_dev(be, W, rb * (size_t)n_out);
    float *dx = kt_dev(be, x, sizeof(float) * (size_t)T * (size_t)n_in);
    float *dy = kt_dev(be, NULL, y_bytes);
    assert_int_equal(be->iface->matmul(be, dy, dW, type, dx, T, n_in, n_out), CAIRN_OK);
    float *y = kt_host(be, dy, y_bytes);
    be->iface->free(be, dy);
    be->iface->free(be, dx);
    be->iface->free(be, dW);
    return y;
}

float *kt_matmul_1_3(const char *isa, int exact, cairn_type type, const uint8_t *W, size_t rb,
                     const float *x, int T, int n_in, int n_out, const char *what)
{
    const size_t y_bytes = sizeof(float) * (size_t)T * (size_t)n_out;
    float *got[2];
    const int threads[2] = {1, 3};
    for (int b = 0; b < 2; b++) {
        cairn_backend *be = kt_cpu_isa(isa, threads[b], exact);
        got[b] = kt_run_matmul(be, type, W, rb, x, T, n_in, n_out);
        cairn_backend_destroy(be);
    }
    KT_SAME_BYTES(got[0], got[1], y_bytes, what);
    free(got[1]);
    return got[0];
}

/* The harness's stand-in for the GPU: the scalar CPU backend with the one
 * trait of CUDA's matmul that the model must work around (kernels/backend.h,
 * "Batch invariance"): up to HARNESS_GEMV_MAX_T rows every row is its own
 * (CUDA's GEMVs), above it the rows come out rounded another way, as a
 * library GEMM's per-shape kernel rounds them. Here "another way" is one
 * more rounding of each value, v + v 2^-22 (a couple of units in the last
 * place: far inside every tolerance the tests allow a GEMM, but never the
 * same bits), so a row that should have stayed on the GEMV path shows. */
#define HARNESS_GEMV_MAX_T 64

typedef struct {
    cairn_backend be; /* first: the handle the tests hold (the CPU's ctx) */
    cairn_backend *cpu;
    cairn_backend_iface iface;
} harness_backend;

static void harness_destroy(cairn_backend *be)
{
    harness_backend *h = (harness_backend *)be;
    cairn_backend_destroy(h->cpu);
    free(h);
}

static int harness_matmul(cairn_backend *be, float *y, const void *W, cairn_type wtype,
                          const float *x, int T, int n_in, int n_out)
{
    harness_backend *h = (harness_backend *)be;
    const int rc = h->cpu->iface->matmul(h->cpu, y, W, wtype, x, T, n_in, n_out);
    if (rc != CAIRN_OK || T <= HARNESS_GEMV_MAX_T)
        return rc;
    for (size_t i = 0; i < (size_t)T * (size_t)n_out; i++) /* CPU memory is host memory */
        y[i] += y[i] * 0x1p-22f;
    return CAIRN_OK;
}

static int harness_invariant_rows(const cairn_backend *be, cairn_type wtype)
{
    (void)be, (void)wtype;
    return HARNESS_GEMV_MAX_T;
}

int kt_open_device(cairn_backend **out)
{
    /* float semantics for the CPU's quantized matmul */
    setenv("CAIRN_CPU_EXACT_MATMUL", "1", 1);
    const char *fake = getenv("CAIRN_GPU_TEST_BACKEND");
    if (fake && strcmp(fake, "cpu") == 0) {
        *out = NULL;
        harness_backend *h = calloc(1, sizeof *h);
        if (!h)
            return CAIRN_ENOMEM;
        setenv("CAIRN_CPU_ISA", "scalar", 1);
        int rc = cairn_backend_cpu_create(1, &h->cpu);
        unsetenv("CAIRN_CPU_ISA");
        if (rc != CAIRN_OK) {
            free(h);
            return rc;
        }
        /* every other slot is the CPU's, run on the CPU's context; one
         * matmul per part, as on CUDA (no matmul_multi) */
        h->iface = *h->cpu->iface;
        h->iface.destroy = harness_destroy;
        h->iface.matmul = harness_matmul;
        h->iface.matmul_multi = NULL;
        h->iface.matmul_invariant_rows = harness_invariant_rows;
        h->be.iface = &h->iface;
        h->be.ctx = h->cpu->ctx;
        *out = &h->be;
        return CAIRN_OK;
    }
    return cairn_backend_cuda_create(0, out);
}
