/*
 * cli/cmd_serve.c — `cairn serve`: load a model into a cairn_service and
 * serve the msgpack-RPC protocol (docs/protocol.md) on TCP and/or a Unix
 * socket until SIGINT or SIGTERM. All the work is in protocol/; this file
 * turns command-line options into a cairn_server_config.
 *
 * When the sockets are bound and the model is loaded it prints one line
 * containing "listening" and the addresses to stderr (with the real port
 * when --port 0 asked for any free one), which is what scripts wait for.
 */
#include "cli/cli.h"
#include "protocol/protocol.h"

#include <errno.h>
#include <getopt.h>
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
    "  -v, --verbose          log every connection\n" CLI_MODEL_HELP
    "  -h, --help             this help\n";

enum {
    OPT_HOST = 3000, OPT_PORT, OPT_NO_TCP, OPT_UNIX, OPT_KV_MEM, OPT_MAX_SEQS, OPT_MAX_SESSIONS,
    OPT_PREFILL, OPT_NO_PREFIX, OPT_CACHE_DIR, OPT_IDLE, OPT_MAX_OUTPUT, OPT_HOST_MEM,
    OPT_DISK_MAX, OPT_TIER_LOADS,
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

int cmd_serve(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_defaults(&mo);
    cairn_server_config cfg;
    cairn_server_config_default(&cfg);
    bool verbose = false, batch_given = false;

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
        switch (opt) {
        case OPT_HOST: cfg.host = optarg; break;
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

    cfg.service.model_path = mo.model_path;
    cfg.service.n_threads = mo.n_threads;
    cfg.service.n_ctx = mo.n_ctx;
    cfg.service.page_size = mo.page_size;
    cfg.service.kv_type = mo.kv_type;
    if (batch_given)
        cfg.service.max_batch_tokens = mo.batch;

    cairn_server *srv = NULL;
    char err[512] = "";
    int rc = cairn_server_create(&cfg, &srv, err, sizeof err);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn serve: %s\n", err[0] ? err : cairn_strerror(rc));
        return 1;
    }
    char where[512];
    cairn_server_describe(srv, where, sizeof where);
    fprintf(stderr, "cairn: listening on %s\n", where);
    fflush(stderr);
    rc = cairn_server_run(srv);
    cairn_server_free(srv);
    fprintf(stderr, "cairn: stopped\n");
    return rc == CAIRN_OK ? 0 : 1;
}
