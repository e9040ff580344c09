/*
 * cli/cmd_serve.c — `cairn serve`: load a model into a cairn_service and
 * serve the msgpack-RPC protocol (docs/protocol.md) on TCP and/or a Unix
 * socket until SIGINT or SIGTERM — and, with --http-port, the OpenAI-compatible
 * HTTP API (docs/openai.md) on the same engine. All the work is in server/;
 * this file turns command-line options into a cairn_server_config.
 *
 * When the sockets are bound and the model is loaded it prints one line
 * containing "listening" and the addresses to stderr (with the real port
 * when --port 0 asked for any free one), which is what scripts wait for.
 *
 * Access (server/server.h section 1, docs/protocol.md "Access control"): the
 * options are checked, and secret files read, before the model is loaded,
 * so a server that would listen on a non-loopback address without a token
 * exits with status 2 without ever binding a socket.
 */
#include "cli/cli.h"
#include "cli/cli_eagle.h"
#include "server/server.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: cairn serve -m MODEL [options]\n\n"
    "Serves the msgpack-RPC protocol (docs/protocol.md) until SIGINT or SIGTERM.\n"
    "Prints a line containing 'listening' to stderr once ready.\n\n"
    "      --host ADDR        TCP address to listen on (default 127.0.0.1)\n"
    "      --port N           TCP port (default 7077; 0 = any free port, printed)\n"
    "      --no-tcp           do not listen on TCP (use with --unix)\n"
    "      --unix PATH        also listen on a Unix socket (created with mode 0600)\n"
    "      --auth-token-file PATH  clients must send `auth` with the token on the first\n"
    "                         line of PATH (mode 0600 or stricter) before anything else\n"
    "      --auth-token TOKEN the same with the token itself (visible to `ps`: prefer\n"
    "                         the file)\n"
    "      --tenants FILE     lines 'NAME TOKEN' (mode 0600): each token authenticates\n"
    "                         one tenant; tenants see only their own sessions and cache\n"
    "                         A --host other than 127.x.x.x or ::1 needs one of these.\n"
    "      --kv-mem SIZE      KV cache memory, with K/M/G suffix (default: room for\n"
    "                         --max-seqs full contexts, at most 1G)\n"
    "      --max-seqs N       requests decoded at once (default 32)\n"
    "      --max-sessions N   open sessions at most (default 4096)\n"
    "      --prefill-chunk N  prompt tokens per request per step (default 256)\n"
    "      --no-prefix-cache  never reuse cached prefixes (for comparisons)\n"
    "      --host-mem SIZE    host-RAM tier for pages evicted from --kv-mem (default\n"
    "                         256M with --cache-dir, else none)\n"
    "      --cache-dir DIR    LMDB disk tier: pages and session records survive restarts\n"
    "      --disk-max SIZE    most the disk tier may use (default 4G)\n"
    "      --tier-loads P     when to load host/disk pages instead of recomputing:\n"
    "                         measured (default: when measured to be faster), always, never\n"
    "      --idle-timeout S   close a connection that sends half a message and then\n"
    "                         nothing for S seconds (default 60)\n"
    "      --max-output SIZE  unread output per connection before it is dropped\n"
    "                         (default 16M)\n"
    "      --http-port N      also serve the OpenAI-compatible HTTP API (docs/openai.md)\n"
    "                         on port N (0 = any free port, printed)\n"
    "      --http-host ADDR   its address (default: --host, else 127.0.0.1)\n"
    "      --http-max-body SIZE  largest request body (default 4M)\n"
    "      --http-timeout S   a request must arrive whole within S seconds (default 30)\n"
    "      --model-name NAME  the model id /v1/models reports (default: the file's name)\n"
    "  -v, --verbose          log every connection\n" CLI_DRAFT_HELP
    "      --draft-max-batch N  speculate only while at most N requests decode (default 4;\n"
    "                           0 = never; on a CPU with a tiny model speculation is slower)\n"
    CLI_MODEL_HELP
    "  -h, --help             this help\n";

enum {
    OPT_HOST = 3000, OPT_PORT, OPT_NO_TCP, OPT_UNIX, OPT_KV_MEM, OPT_MAX_SEQS, OPT_MAX_SESSIONS,
    OPT_PREFILL, OPT_NO_PREFIX, OPT_CACHE_DIR, OPT_IDLE, OPT_MAX_OUTPUT, OPT_HOST_MEM,
    OPT_DISK_MAX, OPT_TIER_LOADS, OPT_AUTH_TOKEN, OPT_AUTH_TOKEN_FILE, OPT_TENANTS,
    OPT_HTTP_PORT, OPT_HTTP_HOST, OPT_HTTP_MAX_BODY, OPT_HTTP_TIMEOUT, OPT_MODEL_NAME,
    OPT_DRAFT_MAX_BATCH,
};

/* "512", "64K", "1.5G" (binary multiples) -> bytes; 0 on a bad value. */
static size_t parse_size(const char *arg)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || !isfinite(v) || v <= 0)
        return 0;
    double mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v * mult >= 1e18)
        return 0;
    return (size_t)(v * mult);
}

static int parse_long(const char *arg, const char *what, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || *end || end == arg || v < lo || v > hi) {
        fprintf(stderr, "cairn serve: %s must be an integer in [%ld, %ld], got '%s'\n", what, lo,
                hi, arg);
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- access options ------------------------------------------------------- */

typedef struct {
    cairn_credential *creds; /* from cairn_tenants_parse, or &shared        */
    size_t n;
    cairn_credential shared;
    char token[CAIRN_AUTH_TOKEN_MAX + 1];
    char what[64];           /* for the listening line                      */
} access_opts;

static void wipe(void *p, size_t n)
{
    volatile char *v = p;
    while (n--)
        *v++ = 0;
}

static void access_opts_clear(access_opts *a)
{
    if (a->creds && a->creds != &a->shared)
        cairn_credentials_free(a->creds, a->n);
    a->creds = NULL;
    a->n = 0;
    wipe(a->token, sizeof a->token);
}

/* Turn --auth-token, --auth-token-file and --tenants into credentials, and
 * refuse a non-loopback listener without any. Returns 0 or the exit status. */
static int load_access(const char *token, const char *token_file, const char *tenants_file,
                       const char *host, const char *http_host, access_opts *a)
{
    memset(a, 0, sizeof *a);
    snprintf(a->what, sizeof a->what, "no authentication");
    int given = (token != NULL) + (token_file != NULL) + (tenants_file != NULL);
    if (given > 1) {
        fprintf(stderr, "cairn serve: give only one of --auth-token, --auth-token-file and "
                        "--tenants\n");
        return 2;
    }
    if (given == 0) {
        if (http_host && !cairn_host_is_loopback(http_host))
            host = http_host; /* the HTTP listener would be public */
        if (!cairn_host_is_loopback(host)) {
            fprintf(stderr,
                    "cairn serve: refusing to listen on %s without authentication: anyone who "
                    "can reach it could use the model and every session.\n"
                    "  Give --auth-token-file PATH (or --auth-token TOKEN, or --tenants FILE), "
                    "or listen on 127.0.0.1 (the default).\n",
                    host);
            return 2;
        }
        return 0;
    }
    char err[300] = "";
    size_t len = 0;
    if (token) {
        if (cairn_token_from_text(token, strlen(token), a->token, &len, err, sizeof err) !=
                CAIRN_OK ||
            strlen(token) != len) {
            fprintf(stderr, "cairn serve: --auth-token: the token must be 1 to %d printable "
                            "ASCII characters without spaces\n",
                    CAIRN_AUTH_TOKEN_MAX);
            return 2;
        }
        /* Out of /proc/PID/cmdline (and so `ps`) from now on; it was there
         * until this moment, which is why the help prefers the file. */
        wipe((char *)token, strlen(token));
    } else {
        const char *path = token_file ? token_file : tenants_file;
        const char *opt = token_file ? "--auth-token-file" : "--tenants";
        char *text = NULL;
        int rc = cairn_secret_file_read(path, &text, &len, err, sizeof err);
        if (rc == CAIRN_OK) {
            if (token_file)
                rc = cairn_token_from_text(text, len, a->token, &len, err, sizeof err);
            else
                rc = cairn_tenants_parse(text, len, &a->creds, &a->n, err, sizeof err);
            wipe(text, strlen(text));
        }
        free(text);
        if (rc != CAIRN_OK) {
            fprintf(stderr, "cairn serve: %s %s: %s\n", opt, path, err[0] ? err :
                    cairn_strerror(rc));
            return 2;
        }
    }
    if (tenants_file) {
        snprintf(a->what, sizeof a->what, "%zu tenant%s", a->n, a->n == 1 ? "" : "s");
        for (size_t i = 0; i < a->n; i++)
            if (strlen(a->creds[i].token) < 16)
                fprintf(stderr, "cairn serve: warning: tenant '%s' has a token shorter than "
                                "16 characters\n", a->creds[i].name);
    } else {
        snprintf(a->what, sizeof a->what, "token required");
        if (strlen(a->token) < 16)
            fprintf(stderr, "cairn serve: warning: the token is shorter than 16 characters\n");
        a->shared.name = NULL;
        a->shared.token = a->token;
        a->creds = &a->shared;
        a->n = 1;
    }
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_defaults(&mo);
    cairn_server_config cfg;
    cairn_server_config_default(&cfg);
    bool verbose = false, batch_given = false;
    const char *auth_token = NULL, *auth_token_file = NULL, *tenants_file = NULL;
    cli_draft_opts draft;
    cli_draft_opts_defaults(&draft);

    static const struct option longopts[] = {
        CLI_MODEL_LONGOPTS,
        {"host", required_argument, 0, OPT_HOST},
        {"port", required_argument, 0, OPT_PORT},
        {"no-tcp", no_argument, 0, OPT_NO_TCP},
        {"unix", required_argument, 0, OPT_UNIX},
        {"kv-mem", required_argument, 0, OPT_KV_MEM},
        {"max-seqs", required_argument, 0, OPT_MAX_SEQS},
        {"max-sessions", required_argument, 0, OPT_MAX_SESSIONS},
        {"prefill-chunk", required_argument, 0, OPT_PREFILL},
        {"no-prefix-cache", no_argument, 0, OPT_NO_PREFIX},
        {"cache-dir", required_argument, 0, OPT_CACHE_DIR},
        {"host-mem", required_argument, 0, OPT_HOST_MEM},
        {"disk-max", required_argument, 0, OPT_DISK_MAX},
        {"tier-loads", required_argument, 0, OPT_TIER_LOADS},
        {"idle-timeout", required_argument, 0, OPT_IDLE},
        {"max-output", required_argument, 0, OPT_MAX_OUTPUT},
        {"auth-token", required_argument, 0, OPT_AUTH_TOKEN},
        {"auth-token-file", required_argument, 0, OPT_AUTH_TOKEN_FILE},
        {"tenants", required_argument, 0, OPT_TENANTS},
        {"http-port", required_argument, 0, OPT_HTTP_PORT},
        {"http-host", required_argument, 0, OPT_HTTP_HOST},
        {"http-max-body", required_argument, 0, OPT_HTTP_MAX_BODY},
        {"http-timeout", required_argument, 0, OPT_HTTP_TIMEOUT},
        {"model-name", required_argument, 0, OPT_MODEL_NAME},
        CLI_DRAFT_LONGOPTS,
        {"draft-max-batch", required_argument, 0, OPT_DRAFT_MAX_BATCH},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    long v;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "vh", longopts, NULL)) != -1) {
        int r = cli_model_opts_parse(&mo, opt, optarg);
        if (r < 0)
            return 2;
        if (r > 0) {
            batch_given |= opt == 'b';
            continue;
        }
        if ((r = cli_draft_opts_parse(&draft, opt, optarg)) < 0)
            return 2;
        if (r > 0)
            continue;
        switch (opt) {
        case OPT_HOST: cfg.host = optarg; break;
        case OPT_DRAFT_MAX_BATCH:
            if (parse_long(optarg, "--draft-max-batch", 0, 1 << 20, &v))
                return 2;
            cfg.service.draft_max_batch = v == 0 ? -1 : (int)v;
            break;
        case OPT_PORT:
            if (parse_long(optarg, "--port", 0, 65535, &v))
                return 2;
            cfg.port = (int)v;
            break;
        case OPT_NO_TCP: cfg.host = NULL; break;
        case OPT_UNIX: cfg.unix_path = optarg; break;
        case OPT_KV_MEM:
            if (!(cfg.service.kv_bytes = parse_size(optarg))) {
                fprintf(stderr, "cairn serve: --kv-mem must be a size like 512M, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_MAX_SEQS:
            if (parse_long(optarg, "--max-seqs", 1, 4096, &v))
                return 2;
            cfg.service.max_seqs = (int)v;
            break;
        case OPT_MAX_SESSIONS:
            if (parse_long(optarg, "--max-sessions", 1, 1L << 30, &v))
                return 2;
            cfg.service.max_sessions = (size_t)v;
            break;
        case OPT_PREFILL:
            if (parse_long(optarg, "--prefill-chunk", 1, 1 << 20, &v))
                return 2;
            cfg.service.prefill_chunk = (int)v;
            break;
        case OPT_NO_PREFIX: cfg.service.no_prefix_cache = true; break;
        case OPT_CACHE_DIR: cfg.service.cache_dir = optarg; break;
        case OPT_TIER_LOADS:
            if (strcmp(optarg, "measured") == 0)
                cfg.service.load_policy = CAIRN_LOAD_MEASURED;
            else if (strcmp(optarg, "always") == 0)
                cfg.service.load_policy = CAIRN_LOAD_ALWAYS;
            else if (strcmp(optarg, "never") == 0)
                cfg.service.load_policy = CAIRN_LOAD_NEVER;
            else {
                fprintf(stderr, "cairn serve: --tier-loads must be measured, always or never\n");
                return 2;
            }
            break;
        case OPT_HOST_MEM:
            if (!(cfg.service.host_bytes = parse_size(optarg))) {
                fprintf(stderr, "cairn serve: --host-mem must be a size like 1G, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_DISK_MAX:
            if (!(cfg.service.disk_bytes = parse_size(optarg))) {
                fprintf(stderr, "cairn serve: --disk-max must be a size like 4G, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_IDLE: {
            char *end;
            double t = strtod(optarg, &end);
            if (*end || end == optarg || !(t > 0 && t < 1e7)) {
                fprintf(stderr, "cairn serve: --idle-timeout must be a positive number of "
                                "seconds\n");
                return 2;
            }
            cfg.idle_timeout_s = t;
            break;
        }
        case OPT_MAX_OUTPUT:
            if (!(cfg.max_output_bytes = parse_size(optarg))) {
                fprintf(stderr, "cairn serve: --max-output must be a size like 16M\n");
                return 2;
            }
            break;
        case OPT_AUTH_TOKEN: auth_token = optarg; break;
        case OPT_AUTH_TOKEN_FILE: auth_token_file = optarg; break;
        case OPT_TENANTS: tenants_file = optarg; break;
        case OPT_HTTP_PORT:
            if (parse_long(optarg, "--http-port", 0, 65535, &v))
                return 2;
            cfg.http.port = (int)v;
            break;
        case OPT_HTTP_HOST: cfg.http.host = optarg; break;
        case OPT_HTTP_MAX_BODY:
            if (!(cfg.http.max_body_bytes = parse_size(optarg))) {
                fprintf(stderr, "cairn serve: --http-max-body must be a size like 4M\n");
                return 2;
            }
            break;
        case OPT_HTTP_TIMEOUT: {
            char *end;
            double t = strtod(optarg, &end);
            if (*end || end == optarg || !(t > 0 && t < 1e7)) {
                fprintf(stderr, "cairn serve: --http-timeout must be a positive number of "
                                "seconds\n");
                return 2;
            }
            cfg.http.timeout_s = t;
            break;
        }
        case OPT_MODEL_NAME: cfg.http.model_name = optarg; break;
        case 'v': verbose = true; break;
        case 'h': fputs(help, stdout); return 0;
        default: fputs(help, stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "cairn serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!cfg.host && !cfg.unix_path) {
        fprintf(stderr, "cairn serve: --no-tcp needs --unix PATH\n");
        return 2;
    }
    if (verbose)
        cairn_log_set_level(CAIRN_LOG_DEBUG);

    access_opts acc;
    if (cfg.http.host && cfg.http.port < 0) {
        fprintf(stderr, "cairn serve: --http-host needs --http-port\n");
        return 2;
    }
    int arc = load_access(auth_token, auth_token_file, tenants_file, cfg.host,
                          cfg.http.port >= 0 ? cfg.http.host : NULL, &acc);
    if (arc != 0)
        return arc;
    cfg.credentials = acc.creds;
    cfg.n_credentials = acc.n;

    cfg.runtime = cli_runtime_config(&mo, draft.head_path);
    /* the model's scratch is sized for the server's batch */
    cfg.runtime.max_seqs = cfg.service.max_seqs > 0 ? cfg.service.max_seqs : 32;
    cfg.service.n_ctx = mo.n_ctx;
    cfg.service.page_size = mo.page_size;
    cfg.service.kv_type = mo.kv_type;
    if (batch_given)
        cfg.service.max_batch_tokens = mo.batch;
    cfg.service.draft = draft.params;

    cairn_server *srv = NULL;
    char err[512] = "";
    int rc = cairn_server_create(&cfg, &srv, err, sizeof err);
    /* The server keeps its own copy of the credentials. */
    access_opts_clear(&acc);
    cfg.credentials = NULL;
    cfg.n_credentials = 0;
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn serve: %s\n", err[0] ? err : cairn_strerror(rc));
        return 1;
    }
    char where[512];
    cairn_server_describe(srv, where, sizeof where);
    fprintf(stderr, "cairn: listening on %s (%s)\n", where, acc.what);
    fflush(stderr);
    rc = cairn_server_run(srv);
    cairn_server_free(srv);
    fprintf(stderr, "cairn: stopped\n");
    return rc == CAIRN_OK ? 0 : 1;
}
