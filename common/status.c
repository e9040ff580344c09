/*
 * common/status.c — what a status code means, and the one way functions with
 * an error buffer fill it (common.h, "Status codes").
 */
#include "common/common.h"

#include <stdarg.h>
#include <stdio.h>

const char *cairn_strerror(int status)
{
    switch (status) {
    case CAIRN_OK: return "ok";
    case CAIRN_EINVAL: return "invalid argument";
    case CAIRN_ENOMEM: return "out of memory";
    case CAIRN_EIO: return "I/O error";
    case CAIRN_EFORMAT: return "malformed or corrupt data";
    case CAIRN_EUNSUPPORTED: return "not supported";
    case CAIRN_ENOTFOUND: return "not found";
    case CAIRN_ERANGE: return "out of range or buffer too small";
    case CAIRN_EFULL: return "no capacity left";
    case CAIRN_EBUSY: return "in use";
    case CAIRN_ECORRUPT: return "stored data failed verification";
    case CAIRN_EBACKEND: return "compute backend error";
    case CAIRN_ECLOSED: return "closed";
    case CAIRN_EPERM: return "not authenticated or not permitted";
    case CAIRN_EQUOTA: return "quota used up";
    default: return "unknown error";
    }
}

int cairn_errorf(char *err, size_t err_len, int rc, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}
