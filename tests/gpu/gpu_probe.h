/*
 * tests/gpu/gpu_probe.h — how a gpu test decides between running, skipping
 * and failing, shared by test_gpu_ops.c and test_gpu_model.c.
 *
 * A skip (exit 77, which ctest counts as "not run" and does not fail on)
 * must mean "there is no GPU here", never "the GPU is there but the backend
 * did not come up" (cuBLAS not found, a compute capability refused, a
 * stream or handle that could not be made): that is the very failure the
 * first run on a GPU machine has to report. So:
 *
 *   CAIRN_GPU_TEST_BACKEND=cpu   the harness self-check: a scalar CPU
 *                                backend stands in for the GPU (runs
 *                                everywhere);
 *   the runtime sees no device   skip (77) with a message, or fail when
 *                                CAIRN_GPU_REQUIRED=1 (a GPU run that lost
 *                                its GPU must not look green);
 *   a device, backend fails      fail, with the backend's logged reason;
 *   a device, backend up         run.
 */
#ifndef CAIRN_TESTS_GPU_PROBE_H
#define CAIRN_TESTS_GPU_PROBE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/support.h"

/* 1 when the backend under test is the CPU harness, not a GPU. */
static inline int gpu_test_is_harness(void)
{
    const char *fake = getenv("CAIRN_GPU_TEST_BACKEND");
    return fake && strcmp(fake, "cpu") == 0;
}

/* Open the backend under test into *out: 0 on success, else the exit code
 * the test must return (77 skip, 1 failure), with the message printed. */
static inline int gpu_test_open(cairn_backend **out, const char *test)
{
    *out = NULL;
    if (!gpu_test_is_harness()) {
        const int count = cairn_backend_cuda_device_count();
        const char *req = getenv("CAIRN_GPU_REQUIRED");
        const int required = req && strcmp(req, "1") == 0;
        if (count < 0) {
            printf("FAIL %s: the CUDA runtime cannot count devices (%s); a driver is "
                   "installed, so this is a broken GPU machine, not one without a GPU\n",
                   test, cairn_strerror(count));
            return 1;
        }
        if (count == 0) {
            if (required) {
                printf("FAIL %s: CAIRN_GPU_REQUIRED=1 but the CUDA runtime sees no device\n",
                       test);
                return 1;
            }
            printf("SKIP %s: no CUDA device (the runtime reports 0); the gpu tests run only on "
                   "a machine with an NVIDIA GPU (CAIRN_GPU_TEST_BACKEND=cpu checks the harness)\n",
                   test);
            return 77;
        }
    }
    const int rc = kt_open_device(out);
    if (rc != CAIRN_OK) {
        printf("FAIL %s: a CUDA device is present but the backend did not come up: %s (the "
               "log above says why)\n",
               test, cairn_strerror(rc));
        return 1;
    }
    return 0;
}

/* What main returns after its group ran (rc: kt_exit_code's): a test that
 * skipped (a device too small for a case, ...) is a skip (77), but a
 * failure under CAIRN_GPU_REQUIRED=1, where the run must check everything. */
static inline int gpu_test_finish(int rc, const char *test)
{
    const char *req = getenv("CAIRN_GPU_REQUIRED");
    if (rc == 77 && req && strcmp(req, "1") == 0) {
        printf("FAIL %s: a test skipped (see above) and CAIRN_GPU_REQUIRED=1\n", test);
        return 1;
    }
    return rc;
}

#endif /* CAIRN_TESTS_GPU_PROBE_H */
