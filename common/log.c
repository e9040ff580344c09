/*
 * common/log.c — diagnostics to stderr (never stdout, which carries generated
 * text) and the monotonic clock.
 */
#include "common/common.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

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

double cairn_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
