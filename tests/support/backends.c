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

int kt_open_device(cairn_backend **out)
{
    /* float semantics for the CPU's quantized matmul */
    setenv("CAIRN_CPU_EXACT_MATMUL", "1", 1);
    const char *fake = getenv("CAIRN_GPU_TEST_BACKEND");
    if (fake && strcmp(fake, "cpu") == 0) {
        setenv("CAIRN_CPU_ISA", "scalar", 1);
        int rc = cairn_backend_cpu_create(1, out);
        unsetenv("CAIRN_CPU_ISA");
        return rc;
    }
    return cairn_backend_cuda_create(0, out);
}
