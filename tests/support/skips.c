/*
 * tests/support/skips.c — skipped cmocka tests made visible to ctest
 * (support.h, "Skips").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "tests/support/support.h"

int kt_n_skipped;

void kt_note_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("SKIP: ");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    kt_n_skipped++;
}

int kt_exit_code(int failed)
{
    if (failed)
        return failed;
    if (kt_n_skipped) {
        printf("%d test(s) skipped (the reasons are above): exiting 77, which ctest reports "
               "as not run\n",
               kt_n_skipped);
        return 77;
    }
    return 0;
}

void kt_select_tests(void)
{
    const char *only = getenv("CAIRN_TEST_ONLY");
    const char *except = getenv("CAIRN_TEST_EXCEPT");
    if (only && *only) {
        printf("CAIRN_TEST_ONLY=%s: only the tests that match run\n", only);
        cmocka_set_test_filter(only);
    }
    if (except && *except) {
        printf("CAIRN_TEST_EXCEPT=%s: the tests that match run in another ctest entry\n", except);
        cmocka_set_skip_filter(except);
    }
    fflush(stdout);
}
