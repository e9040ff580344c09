/*
 * tests/support/skips.c — skipped cmocka tests made visible to ctest
 * (support.h, "Skips").
 */
#include <stdarg.h>
#include <stdio.h>

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
