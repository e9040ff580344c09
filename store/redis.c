/*
 * store/redis.c — where a Redis is and a connection to it: what the shared
 * cache tier (disk_shared.c) and the router (route/events.c) both need,
 * written once, so `serve --shared-cache` and `route --shared-cache` take
 * exactly the same URLs.
 */
#include "store/tiers.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static int bad_url(char *err, size_t err_len, const char *url, const char *why)
{
    return cairn_errorf(err, err_len, CAIRN_EINVAL,
                        "'%s' %s (redis://[:PASSWORD@]HOST[:PORT][/DB] or unix:///PATH[?db=N])",
                        url, why);
}

/* Copy [p, p + n) into a field of cap bytes; false when it does not fit. */
static bool take(char *field, size_t cap, const char *p, size_t n)
{
    if (n >= cap)
        return false;
    memcpy(field, p, n);
    field[n] = '\0';
    return true;
}

int cairn_redis_address_parse(const char *url, cairn_redis_address *a, char *err, size_t err_len)
{
    if (!url || !a)
        return CAIRN_EINVAL;
    memset(a, 0, sizeof *a);
    a->port = 6379;
    if (strncmp(url, "unix://", 7) == 0) {
        const char *p = url + 7, *q = strchr(p, '?');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (n == 0 || p[0] != '/')
            return bad_url(err, err_len, url, "names no socket path");
        if (!take(a->path, sizeof a->path, p, n))
            return bad_url(err, err_len, url, "has a socket path that is too long");
        if (q && strncmp(q, "?db=", 4) == 0)
            a->db = atoi(q + 4);
        return CAIRN_OK;
    }
    if (strncmp(url, "redis://", 8) != 0)
        return bad_url(err, err_len, url, "is not a Redis URL");
    const char *p = url + 8, *at = strchr(p, '@');
    if (at) { /* [USER]:PASSWORD@ */
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *pw = colon ? colon + 1 : p;
        if (!take(a->password, sizeof a->password, pw, (size_t)(at - pw)))
            return bad_url(err, err_len, url, "has a password that is too long");
        p = at + 1;
    }
    const char *slash = strchr(p, '/');
    size_t hostport = slash ? (size_t)(slash - p) : strlen(p);
    const char *colon = memchr(p, ':', hostport);
    size_t hlen = colon ? (size_t)(colon - p) : hostport;
    if (hlen == 0)
        return bad_url(err, err_len, url, "names no host");
    if (!take(a->host, sizeof a->host, p, hlen))
        return bad_url(err, err_len, url, "has a host name that is too long");
    if (colon) {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (end != p + hostport || port <= 0 || port > 65535)
            return bad_url(err, err_len, url, "has a bad port");
        a->port = (int)port;
    }
    if (slash && slash[1])
        a->db = atoi(slash + 1);
    return CAIRN_OK;
}

void cairn_redis_address_describe(const cairn_redis_address *a, char *out, size_t cap)
{
    if (a->path[0])
        snprintf(out, cap, "%s", a->path);
    else
        snprintf(out, cap, "%s:%d", a->host, a->port);
}

static struct timeval tv_of(int ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

/* A reply that is not an error (freed); false and the reason in err. */
static bool answered(redisContext *c, redisReply *r, const char *what, char *err, size_t err_len)
{
    bool ok = r && r->type != REDIS_REPLY_ERROR;
    if (!ok)
        cairn_errorf(err, err_len, CAIRN_EIO, "%s: %s", what,
                     r ? r->str : c->errstr[0] ? c->errstr : "no reply");
    if (r)
        freeReplyObject(r);
    return ok;
}

struct redisContext *cairn_redis_connect(const cairn_redis_address *a, int connect_ms,
                                         int command_ms, char *err, size_t err_len)
{
    struct timeval tv = tv_of(connect_ms);
    redisContext *c = a->path[0] ? redisConnectUnixWithTimeout(a->path, tv)
                                 : redisConnectWithTimeout(a->host, a->port, tv);
    if (!c || c->err) {
        cairn_errorf(err, err_len, CAIRN_EIO, "%s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv_of(command_ms));
    if ((a->password[0] &&
         !answered(c, redisCommand(c, "AUTH %s", a->password), "AUTH", err, err_len)) ||
        (a->db && !answered(c, redisCommand(c, "SELECT %d", a->db), "SELECT", err, err_len))) {
        redisFree(c);
        return NULL;
    }
    return c;
}
