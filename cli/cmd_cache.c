/*
 * cli/cmd_cache.c — `cairn cache explain`: ask a running server why a prompt
 * would not be (all) served from its cache, without running it. The body is
 * what one would send to /v1/chat/completions, /v1/completions or
 * /v1/messages; the server answers POST /v1/cache/explain
 * (docs/why-recomputed.md). A plain blocking HTTP/1.1 exchange: one request,
 * `Connection: close`, the whole answer read to EOF.
 */
#include "cli/cli.h"

#include <getopt.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

static const char help[] =
    "usage: cairn cache explain [--url URL] [--api-key TOKEN] [--json] [FILE]\n\n"
    "Asks a running `cairn serve --http-port` why the prompt of a request body would not be\n"
    "(all) served from its prefix cache, without running it: the cached tokens, where the\n"
    "prompt departs from the closest cached sequence, and the reason (new_content,\n"
    "system_changed, tools_changed, history_rewritten, evicted, in_flight,\n"
    "other_tenant_only, no_cache; see docs/why-recomputed.md).\n\n"
    "FILE (default: stdin) is a JSON body for /v1/chat/completions (messages, tools),\n"
    "/v1/completions (prompt) or /v1/messages (system, messages).\n\n"
    "      --url URL        the server's HTTP address (default http://127.0.0.1:8080)\n"
    "      --api-key TOKEN  its token, when it needs one (default: $CAIRN_API_KEY)\n"
    "      --json           print the server's answer as is\n"
    "  -h, --help           this help\n";

/* "http://HOST[:PORT][/...]" -> host and port (no TLS: a local server). */
static int parse_url(const char *url, char *host, size_t cap, char *port, size_t pcap)
{
    const char *p = strncmp(url, "http://", 7) == 0 ? url + 7 : url;
    const char *end = p + strcspn(p, "/");
    const char *colon = memchr(p, ':', (size_t)(end - p));
    const char *host_end = colon ? colon : end;
    if (host_end == p || (size_t)(host_end - p) >= cap)
        return -1;
    memcpy(host, p, (size_t)(host_end - p));
    host[host_end - p] = 0;
    const char *ps = colon ? colon + 1 : "80";
    size_t pn = colon ? (size_t)(end - ps) : 2;
    if (pn == 0 || pn >= pcap)
        return -1;
    memcpy(port, ps, pn);
    port[pn] = 0;
    return 0;
}

static int connect_to(const char *host, const char *port)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, 0);
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* POST body to host:port/v1/cache/explain; *status and the response body
 * (malloc'd, NUL-terminated) out. */
static char *post_explain(const char *host, const char *port, const char *key, const char *body,
                          size_t body_len, int *status)
{
    int fd = connect_to(host, port);
    if (fd < 0)
        return NULL;
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "POST /v1/cache/explain HTTP/1.1\r\nHost: %s:%s\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n%s%s%s"
                     "Connection: close\r\n\r\n",
                     host, port, body_len, key ? "Authorization: Bearer " : "", key ? key : "",
                     key ? "\r\n" : "");
    char *out = NULL;
    size_t len = 0, cap = 0;
    if (n > 0 && (size_t)n < sizeof head && send_all(fd, head, (size_t)n) == 0 &&
        send_all(fd, body, body_len) == 0) {
        for (;;) {
            if (cap - len < 4096) {
                char *grown = realloc(out, cap = cap ? cap * 2 : 16384);
                if (!grown)
                    break;
                out = grown;
            }
            ssize_t k = recv(fd, out + len, cap - len - 1, 0);
            if (k <= 0)
                break;
            len += (size_t)k;
        }
    }
    close(fd);
    if (!out)
        return NULL;
    out[len] = 0;
    const char *sp = strchr(out, ' '), *sep = strstr(out, "\r\n\r\n");
    if (!sp || !sep) {
        free(out);
        return NULL;
    }
    *status = atoi(sp + 1);
    memmove(out, sep + 4, len - (size_t)(sep + 4 - out) + 1);
    return out;
}

/* An excerpt as a JSON string, so control characters and newlines show. */
static void print_excerpt(const char *label, const json_t *v)
{
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY) : NULL;
    printf("%s%s\n", label, s ? s : "");
    free(s);
}

static int explain(int argc, char **argv)
{
    const char *url = "http://127.0.0.1:8080", *key = getenv("CAIRN_API_KEY");
    bool raw = false;
    static const struct option longopts[] = {
        {"url", required_argument, 0, 1},
        {"api-key", required_argument, 0, 2},
        {"json", no_argument, 0, 3},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (opt) {
        case 1: url = optarg; break;
        case 2: key = optarg; break;
        case 3: raw = true; break;
        default: return cli_help_or_usage(opt, help);
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "cairn cache explain: one FILE at most\n%s", help);
        return 2;
    }
    char host[256], port[16];
    if (parse_url(url, host, sizeof host, port, sizeof port) != 0) {
        fprintf(stderr, "cairn cache explain: --url must be http://HOST[:PORT]\n");
        return 2;
    }
    size_t len = 0;
    char *body = cli_read_file(optind < argc ? argv[optind] : "-", &len);
    if (!body) {
        fprintf(stderr, "cairn cache explain: cannot read %s\n",
                optind < argc ? argv[optind] : "stdin");
        return 1;
    }
    int status = 0;
    char *answer = post_explain(host, port, key && *key ? key : NULL, body, len, &status);
    free(body);
    if (!answer) {
        fprintf(stderr, "cairn cache explain: no answer from %s\n", url);
        return 1;
    }
    json_t *o = json_loads(answer, 0, NULL);
    if (raw || status != 200 || !o) {
        printf("%s\n", answer);
        json_decref(o);
        free(answer);
        return status == 200 ? 0 : 1;
    }
    json_t *m = json_object_get(o, "cache_miss");
    const char *reason = json_string_value(json_object_get(m, "reason"));
    printf("prompt tokens   %lld\ncached tokens   %lld\n",
           (long long)json_integer_value(json_object_get(o, "prompt_tokens")),
           (long long)json_integer_value(json_object_get(o, "cached_tokens")));
    if (json_is_object(m)) {
        const char *evicted = json_string_value(json_object_get(m, "evicted_tier"));
        printf("reason          %s%s%s\n", reason ? reason : "none (a hit)",
               evicted ? ", lost from " : "", evicted ? evicted : "");
        printf("departs at      token %lld (closest cached sequence: %lld tokens)\n",
               (long long)json_integer_value(json_object_get(m, "position")),
               (long long)json_integer_value(json_object_get(m, "closest_tokens")));
        print_excerpt("prompt there    ", json_object_get(m, "prompt_excerpt"));
        print_excerpt("cached there    ", json_object_get(m, "cached_excerpt"));
    } else {
        printf("reason          the server does not cache prefixes\n");
    }
    json_decref(o);
    free(answer);
    return 0;
}

int cmd_cache(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "explain") == 0)
        return explain(argc - 1, argv + 1);
    bool asked = argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0);
    fprintf(asked ? stdout : stderr, "usage: cairn cache explain [options] [FILE]\n\n%s", help);
    return asked ? 0 : 2;
}
