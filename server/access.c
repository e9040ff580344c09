/*
 * server/access.c — who may talk to the server (server.h, "Access
 * control"): the tenants file, secret files, loopback detection, tenant ids,
 * and the token check every connection goes through before anything else.
 *
 * Tokens are compared in constant time: every configured token is compared,
 * always over CAIRN_AUTH_TOKEN_MAX bytes, and the result is selected with
 * masks rather than branches, so the time taken says nothing about which
 * token (or how much of one) matched.
 */
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define SECRET_FILE_MAX (1u << 20) /* a tenants file larger than this is a mistake */

typedef struct {
    char *name;                                /* NULL: the shared token     */
    uint8_t token[CAIRN_AUTH_TOKEN_MAX];       /* zero-padded                */
    size_t token_len;
    uint64_t tenant;                           /* cairn_tenant_id(name); 0 without */
} credential;

struct cairn_access {
    credential *creds;
    size_t n;
};

/* Clear memory that held a secret in a way the compiler may not drop. */
static void wipe(void *p, size_t n)
{
    volatile uint8_t *v = p;
    while (n--)
        *v++ = 0;
}

/* ---- names, tokens, ids --------------------------------------------------- */

uint64_t cairn_tenant_id(const char *name, size_t len)
{
    /* The seed separates this use of XXH3 from every other one in cairn, so
     * a tenant id is not the plain hash of its name that something else
     * might also compute. */
    uint64_t h = XXH3_64bits_withSeed(name, len, CAIRN_TENANT_ID_SEED);
    return h ? h : 1; /* 0 means "no tenants" to the engine */
}

bool cairn_tenant_name_valid(const char *name, size_t len)
{
    if (len == 0 || len > CAIRN_TENANT_NAME_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return false;
    }
    return true;
}

bool cairn_auth_token_valid(const char *token, size_t len)
{
    if (len == 0 || len > CAIRN_AUTH_TOKEN_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)token[i] <= 0x20 || (unsigned char)token[i] >= 0x7f)
            return false;
    return true;
}

bool cairn_host_is_loopback(const char *host)
{
    if (!host)
        return true; /* no TCP listener at all */
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        static const uint8_t loop6[16] = {[15] = 1};
        static const uint8_t mapped[12] = {[10] = 0xff, [11] = 0xff};
        if (memcmp(a6.s6_addr, loop6, 16) == 0)
            return true;
        /* ::ffff:127.x.y.z is the IPv4 loopback seen through IPv6 */
        return memcmp(a6.s6_addr, mapped, 12) == 0 && a6.s6_addr[12] == 127;
    }
    return false; /* a name, or anything else: not known to be loopback */
}

/* ---- files ---------------------------------------------------------------- */

int cairn_secret_file_read(const char *path, char **text, size_t *len, char *err,
                           size_t err_len)
{
    *text = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    int rc = CAIRN_OK;
    if (fstat(fd, &st) != 0)
        rc = cairn_errorf(err, err_len, CAIRN_EIO, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = cairn_errorf(err, err_len, CAIRN_EINVAL, "%s is not a regular file", path);
    else if (st.st_mode & (S_IRWXG | S_IRWXO))
        /* Like ssh with a private key: a secret others can read (or write)
         * is not a secret, and silently using it would hide that. */
        rc = cairn_errorf(err, err_len, CAIRN_EINVAL,
                   "%s holds secrets but is accessible to group or others (mode %03o); "
                   "chmod 600 it",
                   path, (unsigned)(st.st_mode & 0777));
    else if (st.st_size > (off_t)SECRET_FILE_MAX)
        rc = cairn_errorf(err, err_len, CAIRN_ERANGE, "%s is larger than %u bytes", path,
                   SECRET_FILE_MAX);
    char *buf = NULL;
    size_t n = 0;
    if (rc == CAIRN_OK) {
        buf = malloc((size_t)st.st_size + 1);
        if (!buf)
            rc = CAIRN_ENOMEM;
    }
    while (rc == CAIRN_OK && n < (size_t)st.st_size) {
        ssize_t got = read(fd, buf + n, (size_t)st.st_size - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            rc = cairn_errorf(err, err_len, CAIRN_EIO, "%s: %s", path, strerror(errno));
        else if (got == 0)
            break; /* shrank while we read: use what is there */
        else
            n += (size_t)got;
    }
    close(fd);
    if (rc != CAIRN_OK) {
        if (buf)
            wipe(buf, n);
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return CAIRN_OK;
}

int cairn_token_from_text(const char *text, size_t len, char *out, size_t *out_len, char *err,
                          size_t err_len)
{
    size_t n = 0;
    while (n < len && text[n] != '\n')
        n++;
    while (n > 0 && (text[n - 1] == '\r' || text[n - 1] == ' ' || text[n - 1] == '\t'))
        n--;
    size_t start = 0;
    while (start < n && (text[start] == ' ' || text[start] == '\t'))
        start++;
    if (!cairn_auth_token_valid(text + start, n - start))
        return cairn_errorf(err, err_len, CAIRN_EINVAL,
                     "the token must be 1 to %d printable ASCII characters without spaces",
                     CAIRN_AUTH_TOKEN_MAX);
    memcpy(out, text + start, n - start);
    out[n - start] = '\0';
    *out_len = n - start;
    return CAIRN_OK;
}

/* ---- the tenants file ----------------------------------------------------- */

static bool is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\r'; }

int cairn_tenants_parse(const char *text, size_t len, cairn_credential **out, size_t *n_out,
                        char *err, size_t err_len)
{
    *out = NULL;
    *n_out = 0;
    /* One block: the entries, then NUL-terminated copies of every name and
     * token. The copies together never exceed the text plus one NUL per
     * field, and there are at most len/3 + 1 lines with both fields. */
    size_t max_entries = len / 3 + 1;
    size_t bytes = max_entries * sizeof(cairn_credential) + len + 2 * max_entries;
    cairn_credential *creds = malloc(bytes);
    if (!creds)
        return CAIRN_ENOMEM;
    char *strings = (char *)(creds + max_entries);
    size_t n = 0, line_no = 0;
    int rc = CAIRN_OK;
    for (size_t pos = 0; pos < len && rc == CAIRN_OK;) {
        size_t end = pos;
        while (end < len && text[end] != '\n')
            end++;
        line_no++;
        size_t p = pos;
        const char *field[3];
        size_t flen[3];
        int nf = 0;
        while (p < end && is_blank(text[p]))
            p++;
        if (p < end && text[p] != '#') {
            while (p < end) {
                size_t f0 = p;
                while (p < end && !is_blank(text[p]))
                    p++;
                if (nf < 3) {
                    field[nf] = text + f0;
                    flen[nf] = p - f0;
                }
                nf++;
                while (p < end && is_blank(text[p]))
                    p++;
            }
            if (nf != 2)
                rc = cairn_errorf(err, err_len, CAIRN_EINVAL, "line %zu: expected 'NAME TOKEN'",
                           line_no);
            else if (!cairn_tenant_name_valid(field[0], flen[0]))
                rc = cairn_errorf(err, err_len, CAIRN_EINVAL,
                           "line %zu: a tenant name is 1 to %d of A-Z a-z 0-9 . _ -", line_no,
                           CAIRN_TENANT_NAME_MAX);
            else if (!cairn_auth_token_valid(field[1], flen[1]))
                rc = cairn_errorf(err, err_len, CAIRN_EINVAL,
                           "line %zu: a token is 1 to %d printable ASCII characters", line_no,
                           CAIRN_AUTH_TOKEN_MAX);
            if (rc == CAIRN_OK) {
                char *name = strings, *token = strings + flen[0] + 1;
                memcpy(name, field[0], flen[0]);
                name[flen[0]] = '\0';
                memcpy(token, field[1], flen[1]);
                token[flen[1]] = '\0';
                strings = token + flen[1] + 1;
                creds[n].name = name;
                creds[n].token = token;
                n++;
            }
        }
        pos = end + 1;
    }
    if (rc == CAIRN_OK && n == 0)
        rc = cairn_errorf(err, err_len, CAIRN_EINVAL, "no tenants defined");
    if (rc == CAIRN_OK) {
        /* Duplicates are checked here so a bad file fails with its line;
         * cairn_access_create checks again for configurations built in code. */
        for (size_t i = 0; i < n && rc == CAIRN_OK; i++)
            for (size_t j = 0; j < i && rc == CAIRN_OK; j++) {
                if (strcmp(creds[i].name, creds[j].name) == 0)
                    rc = cairn_errorf(err, err_len, CAIRN_EINVAL, "tenant '%s' is defined twice",
                               creds[i].name);
                else if (strcmp(creds[i].token, creds[j].token) == 0)
                    rc = cairn_errorf(err, err_len, CAIRN_EINVAL,
                               "tenants '%s' and '%s' have the same token", creds[j].name,
                               creds[i].name);
            }
    }
    if (rc != CAIRN_OK) {
        wipe(creds, bytes);
        free(creds);
        return rc;
    }
    *out = creds;
    *n_out = n;
    return CAIRN_OK;
}

void cairn_credentials_free(cairn_credential *creds, size_t n)
{
    if (!creds)
        return;
    /* The strings follow the entries in the same block (see above). */
    for (size_t i = 0; i < n; i++) {
        if (creds[i].name)
            wipe((char *)creds[i].name, strlen(creds[i].name));
        wipe((char *)creds[i].token, strlen(creds[i].token));
    }
    free(creds);
}

/* ---- the check ------------------------------------------------------------ */

int cairn_access_create(const cairn_credential *creds, size_t n, cairn_access **out, char *err,
                        size_t err_len)
{
    *out = NULL;
    if (n > 0 && !creds)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "credentials missing");
    size_t n_shared = 0;
    for (size_t i = 0; i < n; i++) {
        const char *tok = creds[i].token, *name = creds[i].name;
        if (!tok || !cairn_auth_token_valid(tok, strlen(tok)))
            return cairn_errorf(err, err_len, CAIRN_EINVAL,
                         "a token must be 1 to %d printable ASCII characters without spaces",
                         CAIRN_AUTH_TOKEN_MAX);
        if (name && !cairn_tenant_name_valid(name, strlen(name)))
            return cairn_errorf(err, err_len, CAIRN_EINVAL, "'%s' is not a valid tenant name", name);
        n_shared += name == NULL;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(tok, creds[j].token) == 0)
                return cairn_errorf(err, err_len, CAIRN_EINVAL, "two credentials have the same token");
            if (name && creds[j].name && strcmp(name, creds[j].name) == 0)
                return cairn_errorf(err, err_len, CAIRN_EINVAL, "tenant '%s' is defined twice", name);
        }
    }
    if (n_shared > 0 && (n_shared > 1 || n > 1))
        /* A nameless token next to tenants would be a door into tenant 0,
         * a namespace none of the tenants can see: surely a mistake. */
        return cairn_errorf(err, err_len, CAIRN_EINVAL,
                     "give either one shared token or named tenants, not both");
    cairn_access *a = calloc(1, sizeof *a);
    if (!a)
        return CAIRN_ENOMEM;
    if (n > 0 && !(a->creds = calloc(n, sizeof *a->creds))) {
        free(a);
        return CAIRN_ENOMEM;
    }
    a->n = n;
    for (size_t i = 0; i < n; i++) {
        credential *c = &a->creds[i];
        c->token_len = strlen(creds[i].token);
        memcpy(c->token, creds[i].token, c->token_len);
        if (creds[i].name) {
            c->name = strdup(creds[i].name);
            if (!c->name) {
                cairn_access_free(a);
                return CAIRN_ENOMEM;
            }
            c->tenant = cairn_tenant_id(c->name, strlen(c->name));
        }
    }
    *out = a;
    return CAIRN_OK;
}

void cairn_access_free(cairn_access *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++)
        free(a->creds[i].name);
    if (a->creds)
        wipe(a->creds, a->n * sizeof *a->creds);
    free(a->creds);
    free(a);
}

bool cairn_access_required(const cairn_access *a) { return a && a->n > 0; }

bool cairn_access_has_tenants(const cairn_access *a)
{
    return a && a->n > 0 && a->creds[0].name != NULL;
}

/* 0 when the zero-padded token equals the given bytes, else nonzero; the
 * same work whatever the bytes are. */
static uint32_t token_diff(const credential *c, const uint8_t *given, size_t given_len)
{
    uint32_t diff = (uint32_t)(c->token_len ^ given_len) | (given_len > CAIRN_AUTH_TOKEN_MAX);
    for (size_t i = 0; i < CAIRN_AUTH_TOKEN_MAX; i++) {
        /* The index is clamped, not branched on: its value depends only on
         * the length the client chose, which it knows anyway. */
        uint8_t g = i < given_len ? given[i] : 0;
        diff |= (uint32_t)(c->token[i] ^ g);
    }
    return diff;
}

int cairn_access_check(const cairn_access *a, const char *token, size_t len, uint64_t *tenant,
                       const char **tenant_name)
{
    *tenant = 0;
    if (tenant_name)
        *tenant_name = NULL;
    if (!cairn_access_required(a))
        return CAIRN_OK; /* nothing to check: every token is accepted */
    const uint8_t *given = (const uint8_t *)(token ? token : "");
    if (!token)
        len = 0;
    /* Go through every credential; remember the match with masks. */
    size_t found = 0;     /* index + 1, or 0 */
    for (size_t i = 0; i < a->n; i++) {
        uint32_t d = token_diff(&a->creds[i], given, len);
        /* match = all ones when d == 0, else 0, without a branch */
        size_t match = (size_t)0 - (size_t)(((uint64_t)d - 1) >> 63);
        found |= match & (i + 1);
    }
    if (found == 0)
        return CAIRN_EPERM;
    const credential *c = &a->creds[found - 1];
    *tenant = c->tenant;
    if (tenant_name)
        *tenant_name = c->name;
    return CAIRN_OK;
}
