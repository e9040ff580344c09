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
#include "api/api.h"
#include "cli/cli.h"
#include "cli/cli_spec.h"
#include "ckpt/ckpt.h"
#include "gguf/gguf.h"
#include "server/server.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char help[] =
    "usage: cairn serve -m MODEL [options]\n\n"
    "Serves the msgpack-RPC protocol (docs/protocol.md) until SIGINT or SIGTERM.\n"
    "Prints a line containing 'listening' to stderr once ready.\n\n"
    "      --host ADDR        TCP address to listen on (default 127.0.0.1)\n"
    "      --port N           TCP port (default 7077 unless only --http-port is given;\n"
    "                         0 = any free port, printed)\n"
    "      --no-tcp           do not listen on TCP (use with --unix)\n"
    "      --unix PATH        also listen on a Unix socket (created with mode 0600)\n"
    "      --auth-token-file PATH  clients must send `auth` with the token on the first\n"
    "                         line of PATH (mode 0600 or stricter) before anything else\n"
    "      --auth-token TOKEN the same with the token itself (visible to `ps`: prefer\n"
    "                         the file); --api-key TOKEN and --api-key-file PATH are\n"
    "                         the same options under vLLM's and llama-server's names\n"
    "      --tenants FILE     lines 'NAME TOKEN' (mode 0600): each token authenticates\n"
    "                         one tenant; tenants see only their own sessions and cache\n"
    "                         A --host other than 127.x.x.x or ::1 needs one of these.\n"
    "      --kv-mem SIZE      KV cache memory, with K/M/G suffix (default on a GPU: 90%\n"
    "                         of the device memory the weights leave, less a tenth of\n"
    "                         the device; on the CPU: room for --max-seqs full\n"
    "                         contexts, at most 1G)\n"
    "      --max-seqs N       requests decoded at once (default 32)\n"
    "      --max-sessions N   open sessions at most (default 4096; stored responses\n"
    "                         of /v1/responses are not counted here)\n"
    "      --max-responses N  stored responses (/v1/responses, store: true) kept at most;\n"
    "                         beyond, the least recently continued go (default 10000)\n"
    "      --responses-ttl T  a stored response expires T after it was made: seconds,\n"
    "                         or with s/m/h/d (default 30d, as OpenAI; 0 = never)\n"
    "      --max-pinned-tokens N  tokens one tenant's retention hints (Anthropic's\n"
    "                         cache_control, OpenAI's prompt_cache_retention: 24h,\n"
    "                         cache_pin) may keep pinned at once; a request past it gets\n"
    "                         429 (default: a quarter of --kv-mem's pages; all tenants\n"
    "                         together never more than half)\n"
    "      --prefill-chunk N  prompt tokens per request per step (default 256)\n"
    "      --progress-ms MS   a prompt still computing after MS logs its progress (tokens,\n"
    "                         tokens/s, ETA), then at most every MS (default 1000; 0: off)\n"
    "      --no-prefix-cache  never reuse cached prefixes (for comparisons)\n"
    "      --host-mem SIZE    host-RAM tier for pages evicted from --kv-mem (default\n"
    "                         on a GPU: page-locked, an eighth of RAM, at most 8G; on\n"
    "                         the CPU: 256M with --cache-dir, else none)\n"
    "      --cache-dir DIR    LMDB disk tier: pages and session records survive restarts\n"
    "      --disk-max SIZE    most the disk tier may use (default 4G)\n"
    "      --no-write-behind  do not write reused prefixes to the disk tier in the\n"
    "                         background (by default they are, so that a kill -9 keeps\n"
    "                         them; without it only eviction and SIGTERM write pages)\n"
    "      --eviction ORDER   what leaves a full tier first: sessions (default: one-off\n"
    "                         prompts, then reused prefixes, then open sessions' history,\n"
    "                         least recently used first within each) or lru (plain LRU,\n"
    "                         for comparisons)\n"
    "      --tier-loads P     when to load host/disk pages instead of recomputing:\n"
    "                         measured (default: when measured to be faster), always, never\n"
    "      --shared-cache URL a Redis shared by replicas under the disk tier (needs\n"
    "                         --cache-dir): redis://[:PASSWORD@]HOST[:PORT][/DB] or\n"
    "                         unix:///PATH; see docs/scale-out.md\n"
    "      --shared-prefix P  prefix of every Redis key (default cairn:)\n"
    "      --shared-write W   which pages go there: reused (default: prefixes seen twice,\n"
    "                         pinned ones, persisted sessions'), all, or none (no pages;\n"
    "                         page events for `cairn route` and session records still go)\n"
    "      --shared-timeout MS  Redis connect/command timeout before it counts as down\n"
    "                         (default 250)\n"
    "      --shared-ttl S     pages expire in Redis after S seconds (default 7 days;\n"
    "                         session records never expire)\n"
    "      --shared-wait S    with --shared-write all: a request whose prefix another\n"
    "                         replica is computing waits for its pages, until S seconds\n"
    "                         pass without a new one (default: 5, or four forward steps\n"
    "                         at this replica's measured speed if longer; 0: never waits)\n"
    "      --kv-events URL    publish the pages this replica holds, as vLLM's KV events\n"
    "                         (ZMQ PUB bound at tcp://HOST:PORT), for vllm-router's\n"
    "                         kv_aware policy, llm-d or Dynamo; see docs/scale-out.md\n"
    "      --kv-events-replay URL  answer replay requests (ZMQ ROUTER bound there)\n"
    "      --kv-events-topic T  the topic frame of every event message (default empty)\n"
    "      --replica-id ID    this replica's name in page events for `cairn route`\n"
    "                         (default: its HTTP address, else its TCP address)\n"
    "      --idle-timeout S   close a connection that sends half a message and then\n"
    "                         nothing for S seconds (default 60)\n"
    "      --drain-timeout S  on SIGTERM/SIGINT, stop accepting and let running requests\n"
    "                         finish for up to S seconds, then end them (streams get\n"
    "                         their last chunk); a second signal stops at once (default 30)\n"
    "      --max-output SIZE  unread output per connection before it is dropped\n"
    "                         (default 16M)\n"
    "      --http-port N      serve the OpenAI-compatible HTTP API (docs/openai.md) and\n"
    "                         the web page at / on port N (0 = any free port, printed);\n"
    "                         alone, without --port or --unix, it is the only listener\n"
    "      --http-host ADDR   its address (default: --host, else 127.0.0.1)\n"
    "      --http-max-body SIZE  largest request body (default 4M)\n"
    "      --http-timeout S   a request must arrive whole within S seconds (default 30)\n"
    "      --model-name NAME  the model id /v1/models reports (default: the file's name)\n"
    "      --default-chat-template-kwargs JSON  what a chat request's chat_template_kwargs\n"
    "                         hold when it does not say, e.g. '{\"enable_thinking\": false}'\n"
    "                         (Qwen3 answers without reasoning) or '{\"reasoning_effort\":\n"
    "                         \"high\"}' (gpt-oss); a request's own keys win\n"
    "      --cors-origin LIST let pages of these origins (comma-separated, or *) call the\n"
    "                         HTTP API from a browser (default: none)\n"
    "      --no-web           no chat and cache page at / of the HTTP port (docs/web.md)\n"
    "  -v, --verbose          log every connection\n" CLI_DRAFT_HELP
    "      --draft-max-batch N  speculate only while at most N requests decode (default 4,\n"
    "                           1 with a draft model, whose forwards are per request;\n"
    "                           0 = never)\n"
    CLI_MODEL_HELP
    "  -h, --help             this help\n";

enum {
    OPT_HOST = 3000, OPT_PORT, OPT_NO_TCP, OPT_UNIX, OPT_KV_MEM, OPT_MAX_SEQS, OPT_MAX_SESSIONS,
    OPT_MAX_RESPONSES, OPT_RESPONSES_TTL,
    OPT_PREFILL, OPT_PROGRESS, OPT_NO_PREFIX, OPT_CACHE_DIR, OPT_IDLE, OPT_MAX_OUTPUT, OPT_HOST_MEM,
    OPT_DISK_MAX, OPT_TIER_LOADS, OPT_AUTH_TOKEN, OPT_AUTH_TOKEN_FILE, OPT_TENANTS,
    OPT_HTTP_PORT, OPT_HTTP_HOST, OPT_HTTP_MAX_BODY, OPT_HTTP_TIMEOUT, OPT_MODEL_NAME,
    OPT_CORS_ORIGIN, OPT_DRAIN_TIMEOUT,
    OPT_DRAFT_MAX_BATCH, OPT_SHARED_CACHE, OPT_SHARED_PREFIX, OPT_SHARED_WRITE, OPT_SHARED_TIMEOUT,
    OPT_REPLICA_ID, OPT_SHARED_TTL, OPT_SHARED_WAIT,
    OPT_NO_WEB, OPT_NO_WRITE_BEHIND, OPT_EVICTION, OPT_MAX_PINNED, OPT_KV_EVENTS,
    OPT_KV_EVENTS_REPLAY, OPT_KV_EVENTS_TOPIC, OPT_TEMPLATE_KWARGS,
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

/* A size option: 1 with *out set, or -1 after "WHAT must be a size like
 * EXAMPLE", followed by the value given when `echo` is set (the messages of
 * --kv-mem, --host-mem and --disk-max have it, the others not). */
static int parse_size_opt(const char *arg, const char *what, const char *example, bool echo,
                          size_t *out)
{
    if (!(*out = parse_size(arg))) {
        if (echo)
            fprintf(stderr, "cairn serve: %s must be a size like %s, got '%s'\n", what, example,
                    arg);
        else
            fprintf(stderr, "cairn serve: %s must be a size like %s\n", what, example);
        return -1;
    }
    return 1;
}

/* A timeout in seconds, in (0, 1e7): 1 with *out set, or -1 after saying so. */
static int parse_seconds_opt(const char *arg, const char *what, double *out)
{
    char *end;
    double t = strtod(arg, &end);
    if (*end || end == arg || !(t > 0 && t < 1e7)) {
        fprintf(stderr, "cairn serve: %s must be a positive number of seconds\n", what);
        return -1;
    }
    *out = t;
    return 1;
}

/* An integer option under "cairn serve" into an int field. */
static int parse_int_opt(const char *arg, const char *what, long lo, long hi, int *out)
{
    long v;
    if (cli_parse_long("cairn serve", arg, what, lo, hi, &v) < 0)
        return -1;
    *out = (int)v;
    return 1;
}

/* ---- options -------------------------------------------------------------- */

typedef struct {
    cli_model_opts model;
    cli_draft_opts draft;
    cairn_server_config cfg; /* what the options set; the runtime and the
                                model's service settings come at set-up    */
    bool verbose;
    const char *auth_token, *auth_token_file, *tenants_file;
    cairn_shared_config shared; /* --shared-*: tier 3 when url is set      */
    bool port_given, host_given; /* --port, --host: the msgpack TCP listener */
    bool shared_write_given;
} serve_opts;

/* The engine's options (cfg.service): 1 if `opt` was one, 0 if not, -1 on a
 * bad value (printed). */
static int parse_service_opt(cairn_service_config *svc, int opt, const char *arg)
{
    long v;
    switch (opt) {
    case OPT_DRAFT_MAX_BATCH:
        if (cli_parse_long("cairn serve", arg, "--draft-max-batch", 0, 1 << 20, &v) < 0)
            return -1;
        svc->draft_max_batch = v == 0 ? -1 : (int)v; /* the config's "never" */
        return 1;
    case OPT_KV_MEM: return parse_size_opt(arg, "--kv-mem", "512M", true, &svc->kv_bytes);
    case OPT_MAX_SEQS: return parse_int_opt(arg, "--max-seqs", 1, 4096, &svc->max_seqs);
    case OPT_MAX_SESSIONS:
        if (cli_parse_long("cairn serve", arg, "--max-sessions", 1, 1L << 30, &v) < 0)
            return -1;
        svc->max_sessions = (size_t)v;
        return 1;
    case OPT_MAX_PINNED:
        if (cli_parse_long("cairn serve", arg, "--max-pinned-tokens", 1, 1L << 40, &v) < 0)
            return -1;
        svc->max_pinned_tokens = (size_t)v;
        return 1;
    case OPT_MAX_RESPONSES:
        if (cli_parse_long("cairn serve", arg, "--max-responses", 1, 1L << 30, &v) < 0)
            return -1;
        svc->max_responses = (size_t)v;
        return 1;
    case OPT_RESPONSES_TTL: {
        /* seconds, or a number with s, m, h or d; 0: never expire */
        char *end;
        double t = strtod(arg, &end);
        double unit = !*end ? 1 : !strcmp(end, "s") ? 1 : !strcmp(end, "m") ? 60
                    : !strcmp(end, "h") ? 3600 : !strcmp(end, "d") ? 86400 : 0;
        if (end == arg || !unit || !(t >= 0 && t * unit < 1e10)) {
            fprintf(stderr, "cairn serve: --responses-ttl must be a number of seconds, or with "
                            "s, m, h or d (30d), or 0 for never\n");
            return -1;
        }
        svc->response_ttl_s = t == 0 ? -1 : t * unit; /* the config's "never" is < 0 */
        return 1;
    }
    case OPT_PREFILL: return parse_int_opt(arg, "--prefill-chunk", 1, 1 << 20, &svc->prefill_chunk);
    case OPT_PROGRESS:
        if (cli_parse_long("cairn serve", arg, "--progress-ms", 0, 1L << 30, &v) < 0)
            return -1;
        svc->progress_ms = v == 0 ? -1 : (int)v; /* the config's "never" */
        return 1;
    case OPT_NO_PREFIX: svc->no_prefix_cache = true; return 1;
    case OPT_CACHE_DIR: svc->cache_dir = arg; return 1;
    case OPT_NO_WRITE_BEHIND: svc->no_write_behind = true; return 1;
    case OPT_KV_EVENTS: svc->kv_events = arg; return 1;
    case OPT_KV_EVENTS_REPLAY: svc->kv_events_replay = arg; return 1;
    case OPT_KV_EVENTS_TOPIC: svc->kv_events_topic = arg; return 1;
    case OPT_EVICTION:
        if (strcmp(arg, "lru") == 0 || strcmp(arg, "sessions") == 0) {
            svc->plain_lru = strcmp(arg, "lru") == 0;
            return 1;
        }
        fprintf(stderr, "cairn serve: --eviction must be sessions or lru, not '%s'\n", arg);
        return -1;
    case OPT_TIER_LOADS: return cli_parse_load_policy("cairn serve", arg, &svc->load_policy);
    case OPT_HOST_MEM: return parse_size_opt(arg, "--host-mem", "1G", true, &svc->host_bytes);
    case OPT_DISK_MAX: return parse_size_opt(arg, "--disk-max", "4G", true, &svc->disk_bytes);
    default: return 0;
    }
}

/* The shared tier's options (o->shared), in the same convention. */
static int parse_shared_opt(serve_opts *o, int opt, const char *arg)
{
    switch (opt) {
    case OPT_SHARED_CACHE: o->shared.url = arg; return 1;
    case OPT_SHARED_PREFIX:
        if (!arg[0] || strlen(arg) > 128) {
            fprintf(stderr, "cairn serve: --shared-prefix must be 1 to 128 bytes\n");
            return -1;
        }
        o->shared.prefix = arg;
        return 1;
    case OPT_SHARED_WRITE:
        if (strcmp(arg, "reused") == 0)
            o->cfg.service.share_policy = CAIRN_SHARE_REUSED;
        else if (strcmp(arg, "all") == 0)
            o->cfg.service.share_policy = CAIRN_SHARE_ALL;
        else if (strcmp(arg, "none") == 0)
            o->cfg.service.share_policy = CAIRN_SHARE_NONE;
        else {
            fprintf(stderr, "cairn serve: --shared-write must be reused, all or none\n");
            return -1;
        }
        o->shared_write_given = true;
        return 1;
    case OPT_SHARED_TIMEOUT:
        return parse_int_opt(arg, "--shared-timeout", 1, 600000, &o->shared.timeout_ms);
    case OPT_SHARED_WAIT: {
        long v;
        if (cli_parse_long("cairn serve", arg, "--shared-wait", 0, 3600, &v) < 0)
            return -1;
        o->cfg.service.shared_wait_s = v > 0 ? (double)v : -1;
        o->shared_write_given = true; /* needs --shared-cache like the others */
        return 1;
    }
    case OPT_SHARED_TTL: {
        long v;
        if (cli_parse_long("cairn serve", arg, "--shared-ttl", 1, 1L << 40, &v) < 0)
            return -1;
        o->shared.page_ttl_s = v;
        return 1;
    }
    case OPT_REPLICA_ID:
        if (!arg[0] || strlen(arg) > CAIRN_SHARED_REPLICA_MAX) {
            fprintf(stderr, "cairn serve: --replica-id must be 1 to %d bytes\n",
                    CAIRN_SHARED_REPLICA_MAX);
            return -1;
        }
        o->shared.replica = arg;
        return 1;
    default: return 0;
    }
}

/* The listeners' and access options, in the same convention. */
static int parse_listener_opt(serve_opts *o, int opt, const char *arg)
{
    cairn_server_config *cfg = &o->cfg;
    switch (opt) {
    case OPT_HOST: cfg->host = arg; o->host_given = true; return 1;
    case OPT_PORT:
        o->port_given = true;
        return parse_int_opt(arg, "--port", 0, 65535, &cfg->port);
    case OPT_NO_TCP: cfg->host = NULL; return 1;
    case OPT_UNIX: cfg->unix_path = arg; return 1;
    case OPT_IDLE: return parse_seconds_opt(arg, "--idle-timeout", &cfg->idle_timeout_s);
    case OPT_MAX_OUTPUT:
        return parse_size_opt(arg, "--max-output", "16M", false, &cfg->max_output_bytes);
    case OPT_AUTH_TOKEN: o->auth_token = arg; return 1;
    case OPT_AUTH_TOKEN_FILE: o->auth_token_file = arg; return 1;
    case OPT_TENANTS: o->tenants_file = arg; return 1;
    case OPT_HTTP_PORT: return parse_int_opt(arg, "--http-port", 0, 65535, &cfg->http.port);
    case OPT_HTTP_HOST: cfg->http.host = arg; return 1;
    case OPT_CORS_ORIGIN: cfg->http.cors_origins = arg; return 1;
    case OPT_NO_WEB: cfg->http.no_web = true; return 1;
    case OPT_DRAIN_TIMEOUT: return parse_seconds_opt(arg, "--drain-timeout", &cfg->drain_timeout_s);
    case OPT_HTTP_MAX_BODY:
        return parse_size_opt(arg, "--http-max-body", "4M", false, &cfg->http.max_body_bytes);
    case OPT_HTTP_TIMEOUT: return parse_seconds_opt(arg, "--http-timeout", &cfg->http.timeout_s);
    case OPT_MODEL_NAME: cfg->http.model_name = arg; return 1;
    case OPT_TEMPLATE_KWARGS: {
        char err[320];
        if (cairn_api_template_kwargs_flags(arg, &cfg->default_chat_flags, err, sizeof err)) {
            fprintf(stderr, "cairn serve: --default-chat-template-kwargs: %s\n", err);
            return -1;
        }
        return 1;
    }
    case 'v': o->verbose = true; return 1;
    default: return 0;
    }
}

/* The command line into *o: CLI_PROCEED, or the exit status. */
static int parse_serve_opts(serve_opts *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_MODEL_LONGOPTS,
        {"host", required_argument, 0, OPT_HOST},
        {"port", required_argument, 0, OPT_PORT},
        {"no-tcp", no_argument, 0, OPT_NO_TCP},
        {"unix", required_argument, 0, OPT_UNIX},
        {"kv-mem", required_argument, 0, OPT_KV_MEM},
        {"max-seqs", required_argument, 0, OPT_MAX_SEQS},
        {"max-sessions", required_argument, 0, OPT_MAX_SESSIONS},
        {"max-responses", required_argument, 0, OPT_MAX_RESPONSES},
        {"responses-ttl", required_argument, 0, OPT_RESPONSES_TTL},
        {"max-pinned-tokens", required_argument, 0, OPT_MAX_PINNED},
        {"prefill-chunk", required_argument, 0, OPT_PREFILL},
        {"progress-ms", required_argument, 0, OPT_PROGRESS},
        {"no-prefix-cache", no_argument, 0, OPT_NO_PREFIX},
        {"cache-dir", required_argument, 0, OPT_CACHE_DIR},
        {"host-mem", required_argument, 0, OPT_HOST_MEM},
        {"disk-max", required_argument, 0, OPT_DISK_MAX},
        {"no-write-behind", no_argument, 0, OPT_NO_WRITE_BEHIND},
        {"kv-events", required_argument, 0, OPT_KV_EVENTS},
        {"kv-events-replay", required_argument, 0, OPT_KV_EVENTS_REPLAY},
        {"kv-events-topic", required_argument, 0, OPT_KV_EVENTS_TOPIC},
        {"eviction", required_argument, 0, OPT_EVICTION},
        {"tier-loads", required_argument, 0, OPT_TIER_LOADS},
        {"idle-timeout", required_argument, 0, OPT_IDLE},
        {"max-output", required_argument, 0, OPT_MAX_OUTPUT},
        {"auth-token", required_argument, 0, OPT_AUTH_TOKEN},
        {"auth-token-file", required_argument, 0, OPT_AUTH_TOKEN_FILE},
        {"api-key", required_argument, 0, OPT_AUTH_TOKEN},
        {"api-key-file", required_argument, 0, OPT_AUTH_TOKEN_FILE},
        {"tenants", required_argument, 0, OPT_TENANTS},
        {"http-port", required_argument, 0, OPT_HTTP_PORT},
        {"http-host", required_argument, 0, OPT_HTTP_HOST},
        {"http-max-body", required_argument, 0, OPT_HTTP_MAX_BODY},
        {"http-timeout", required_argument, 0, OPT_HTTP_TIMEOUT},
        {"cors-origin", required_argument, 0, OPT_CORS_ORIGIN},
        {"no-web", no_argument, 0, OPT_NO_WEB},
        {"drain-timeout", required_argument, 0, OPT_DRAIN_TIMEOUT},
        {"model-name", required_argument, 0, OPT_MODEL_NAME},
        {"default-chat-template-kwargs", required_argument, 0, OPT_TEMPLATE_KWARGS},
        CLI_DRAFT_LONGOPTS,
        {"draft-max-batch", required_argument, 0, OPT_DRAFT_MAX_BATCH},
        {"shared-cache", required_argument, 0, OPT_SHARED_CACHE},
        {"shared-prefix", required_argument, 0, OPT_SHARED_PREFIX},
        {"shared-write", required_argument, 0, OPT_SHARED_WRITE},
        {"shared-timeout", required_argument, 0, OPT_SHARED_TIMEOUT},
        {"replica-id", required_argument, 0, OPT_REPLICA_ID},
        {"shared-ttl", required_argument, 0, OPT_SHARED_TTL},
        {"shared-wait", required_argument, 0, OPT_SHARED_WAIT},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    cli_model_opts_defaults(&o->model);
    cli_draft_opts_defaults(&o->draft);
    cairn_server_config_default(&o->cfg);
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "vh", longopts, NULL)) != -1) {
        int r = cli_model_opts_parse(&o->model, opt, optarg);
        if (r == 0)
            r = cli_draft_opts_parse(&o->draft, opt, optarg);
        if (r == 0)
            r = parse_service_opt(&o->cfg.service, opt, optarg);
        if (r == 0)
            r = parse_listener_opt(o, opt, optarg);
        if (r == 0)
            r = parse_shared_opt(o, opt, optarg);
        if (r < 0)
            return 2;
        if (r == 0)
            return cli_help_or_usage(opt, help);
    }
    return cli_no_operands("cairn serve", argc, argv);
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

/* ---- the start banner ----------------------------------------------------- */

/* GGUF general.file_type (the quantization a file was made with). */
static const char *file_type_name(uint32_t t)
{
    static const struct { uint32_t id; const char *name; } names[] = {
        {0, "F32"}, {1, "F16"}, {2, "Q4_0"}, {3, "Q4_1"}, {7, "Q8_0"}, {8, "Q5_0"},
        {9, "Q5_1"}, {10, "Q2_K"}, {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"},
        {14, "Q4_K_S"}, {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"},
        {32, "BF16"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].id == t)
            return names[i].name;
    return NULL;
}

static const char *tensor_type_name(cairn_type t)
{
    switch (t) {
    case CAIRN_TYPE_F32: return "F32";
    case CAIRN_TYPE_F16: return "F16";
    case CAIRN_TYPE_BF16: return "BF16";
    case CAIRN_TYPE_Q4_0: return "Q4_0";
    case CAIRN_TYPE_Q4_1: return "Q4_1";
    case CAIRN_TYPE_Q5_0: return "Q5_0";
    case CAIRN_TYPE_Q5_1: return "Q5_1";
    case CAIRN_TYPE_Q8_0: return "Q8_0";
    case CAIRN_TYPE_Q2_K: return "Q2_K";
    case CAIRN_TYPE_Q3_K: return "Q3_K";
    case CAIRN_TYPE_Q4_K: return "Q4_K";
    case CAIRN_TYPE_Q5_K: return "Q5_K";
    case CAIRN_TYPE_Q6_K: return "Q6_K";
    case CAIRN_TYPE_Q4_Z: return "Q4 (AWQ/GPTQ)";
    case CAIRN_TYPE_F8_E4M3: return "FP8";
    default: return "other";
    }
}

/* The weights' type of a GGUF file: its general.file_type, and the type
 * that holds most of its bytes (what a file without the key is). Not
 * general.name, which is a free text and often names another format. */
static void weight_types(const char *path, char *out, size_t cap)
{
    snprintf(out, cap, "checkpoint folder");
    cairn_gguf *g = NULL;
    char err[128];
    if (cairn_ckpt_is_folder(path) || cairn_gguf_open(path, &g, err, sizeof err) != CAIRN_OK)
        return;
    uint64_t bytes[CAIRN_TYPE_COUNT_] = {0};
    for (int64_t i = 0; i < cairn_gguf_n_tensors(g); i++) {
        const cairn_gguf_tensor *t = cairn_gguf_tensor_at(g, i);
        if ((int)t->type >= 0 && t->type < CAIRN_TYPE_COUNT_)
            bytes[t->type] += t->size;
    }
    int most = 0;
    for (int t = 1; t < CAIRN_TYPE_COUNT_; t++)
        if (bytes[t] > bytes[most])
            most = t;
    uint32_t ft;
    const char *file = cairn_gguf_get_u32(g, "general.file_type", &ft) == CAIRN_OK
                           ? file_type_name(ft) : NULL;
    if (file)
        snprintf(out, cap, "%s (most bytes %s)", file, tensor_type_name((cairn_type)most));
    else
        snprintf(out, cap, "%s", tensor_type_name((cairn_type)most));
    cairn_gguf_close(g);
}

static void size_text(size_t bytes, char *out, size_t cap)
{
    if (bytes >= (size_t)1 << 30)
        snprintf(out, cap, "%.1f GiB", (double)bytes / (1 << 30));
    else
        snprintf(out, cap, "%.1f MiB", (double)bytes / (1 << 20));
}

/* What is served, where, and how to talk to it: the lines before the
 * listening line (the web page's URL first among the addresses). */
static void print_banner_head(cairn_server *srv, const cairn_server_config *cfg)
{
    cairn_service *svc = cairn_server_service(srv);
    cairn_runtime *rt = cairn_service_runtime(svc);
    const cairn_hparams *hp = cairn_service_hparams(svc);
    const char *path = cairn_runtime_model_path(rt);
    const char *base = strrchr(path, '/');
    base = base && base[1] ? base + 1 : path;
    char weights[96], device[32], kv[32], host[32], disk[32];
    weight_types(path, weights, sizeof weights);
    cairn_device_name(cairn_runtime_device(rt), device, sizeof device);
    size_t kv_b, host_b, disk_b;
    cairn_service_tier_bytes(svc, &kv_b, &host_b, &disk_b);
    size_text(kv_b, kv, sizeof kv);
    size_text(host_b, host, sizeof host);
    size_text(disk_b, disk, sizeof disk);
    fprintf(stderr, "cairn: model    %s (%s, \"%s\"), context %d\n", base, hp->arch, hp->name,
            cairn_service_n_ctx(svc));
    fprintf(stderr, "cairn: weights  %s, KV %s, device %s (%d threads)\n", weights,
            cairn_service_kv_type(svc), device, cairn_runtime_threads(rt));
    fprintf(stderr, "cairn: tiers    device KV %s, host RAM %s, disk %s%s%s%s\n", kv,
            host_b ? host : "off", disk_b ? disk : "off", disk_b ? " in " : "",
            disk_b ? cfg->service.cache_dir : "",
            cfg->service.shared ? ", shared cache (Redis)" : "");
    int port = cairn_server_http_port(srv);
    if (port >= 0) {
        /* hook: the web page (web/) is served at / unless --no-web */
        const char *h = cfg->http.host ? cfg->http.host : cfg->host ? cfg->host : "127.0.0.1";
        if (strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0)
            h = "127.0.0.1";
        fprintf(stderr, "cairn: web page http://%s%s%s:%d/\n", strchr(h, ':') ? "[" : "", h,
                strchr(h, ':') ? "]" : "", port);
    }
}

/* After the listening line, last: how to connect. */
static void print_banner_tail(cairn_server *srv, const cairn_server_config *cfg, bool token)
{
    int port = cairn_server_http_port(srv);
    if (port < 0) {
        fprintf(stderr, "cairn: connect  with the msgpack protocol (docs/protocol.md), e.g. the "
                        "Python client in clients/python; --http-port N adds the OpenAI API\n");
        return;
    }
    const char *h = cfg->http.host ? cfg->http.host : cfg->host ? cfg->host : "127.0.0.1";
    if (strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0)
        h = "127.0.0.1";
    char url[300];
    snprintf(url, sizeof url, "http://%s%s%s:%d", strchr(h, ':') ? "[" : "", h,
             strchr(h, ':') ? "]" : "", port);
    fprintf(stderr, "cairn: try      curl %s/v1/chat/completions -H 'Content-Type: "
                    "application/json'%s -d '{\"messages\":[{\"role\":\"user\",\"content\":"
                    "\"Hello\"}]}'\n", url, token ? " -H \"Authorization: Bearer $TOKEN\"" : "");
    fprintf(stderr, "cairn: python   from openai import OpenAI; OpenAI(base_url=\"%s/v1\", "
                    "api_key=%s).chat.completions.create(model=\"any\", messages=[{\"role\": "
                    "\"user\", \"content\": \"Hello\"}])\n", url,
            token ? "\"$TOKEN\"" : "\"none\"");
}

/* ---- set-up and the action ------------------------------------------------ */

/* The checks on the options together, then the access credentials (read
 * before the model is loaded, see the top of this file), then the rest of
 * o->cfg from the shared options. CLI_PROCEED or the exit status. */
static int prepare_serve(serve_opts *o, access_opts *acc)
{
    cairn_server_config *cfg = &o->cfg;
    /* --http-port alone is an HTTP server: the msgpack port is bound only
     * when --port asks for it (or without HTTP), so a second server on the
     * same machine needs one port flag. --host is then HTTP's address. */
    if (cfg->http.port >= 0 && !o->port_given && cfg->host) {
        if (!cfg->http.host && o->host_given)
            cfg->http.host = cfg->host;
        cfg->host = NULL;
    }
    if (!cfg->host && !cfg->unix_path && cfg->http.port < 0) {
        fprintf(stderr, "cairn serve: --no-tcp needs --unix PATH or --http-port N\n");
        return 2;
    }
    if (o->verbose)
        cairn_log_set_level(CAIRN_LOG_DEBUG);
    if (cfg->http.host && cfg->http.port < 0) {
        fprintf(stderr, "cairn serve: --http-host needs --http-port\n");
        return 2;
    }
    if (!cfg->service.kv_events &&
        (cfg->service.kv_events_replay || cfg->service.kv_events_topic)) {
        fprintf(stderr, "cairn serve: --kv-events-replay and --kv-events-topic need "
                        "--kv-events URL\n");
        return 2;
    }
    if (!o->shared.url && (o->shared.prefix || o->shared.replica || o->shared.timeout_ms ||
                           o->shared.page_ttl_s || o->shared_write_given)) {
        fprintf(stderr, "cairn serve: --shared-prefix, --shared-write, --shared-timeout, "
                        "--shared-ttl, --shared-wait and --replica-id need --shared-cache URL\n");
        return 2;
    }
    if (o->shared.url && !cfg->service.cache_dir) {
        fprintf(stderr, "cairn serve: --shared-cache needs --cache-dir DIR (the shared tier "
                        "sits under the disk tier: pages from Redis land there first)\n");
        return 2;
    }
    if (o->shared.url)
        cfg->service.shared = &o->shared;
    int arc = load_access(o->auth_token, o->auth_token_file, o->tenants_file, cfg->host,
                          cfg->http.port >= 0 ? cfg->http.host : NULL, acc);
    if (arc != 0)
        return arc;
    cfg->credentials = acc->creds;
    cfg->n_credentials = acc->n;

    cfg->runtime = cli_spec_runtime_config(&o->model, &o->draft);
    /* the model's scratch is sized for the server's batch */
    cfg->runtime.max_seqs = cfg->service.max_seqs > 0 ? cfg->service.max_seqs : 32;
    cfg->service.n_ctx = o->model.n_ctx;
    cfg->service.page_size = o->model.page_size;
    cfg->service.kv_type = o->model.kv_type;
    if (o->model.batch_given)
        cfg->service.max_batch_tokens = o->model.batch;
    cfg->service.draft = o->draft.params;
    return CLI_PROCEED;
}

/* Bind, load, print the listening line and serve until a signal: the exit
 * status. */
static int run_server(cairn_server_config *cfg, access_opts *acc, const char *replica)
{
    cairn_server *srv = NULL;
    char err[512] = "";
    /* The load can take a while (a big file, repacking): say so first. */
    struct stat st;
    const double t0 = cairn_now();
    if (cfg->runtime.model_path && stat(cfg->runtime.model_path, &st) == 0 && S_ISREG(st.st_mode))
        cairn_log(CAIRN_LOG_INFO, "loading %s (%.1f MiB)", cfg->runtime.model_path,
                  (double)st.st_size / (1 << 20));
    else if (cfg->runtime.model_path)
        cairn_log(CAIRN_LOG_INFO, "loading %s", cfg->runtime.model_path);
    int rc = cairn_server_create(cfg, &srv, err, sizeof err);
    if (rc == CAIRN_OK)
        cairn_log(CAIRN_LOG_INFO, "ready in %.1f s", cairn_now() - t0);
    /* The server keeps its own copy of the credentials. */
    access_opts_clear(acc);
    cfg->credentials = NULL;
    cfg->n_credentials = 0;
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn serve: %s\n", err[0] ? err : cairn_strerror(rc));
        return 1;
    }
    char where[512];
    cairn_server_describe(srv, where, sizeof where);
    if (cfg->service.shared) {
        char id[CAIRN_SHARED_REPLICA_MAX + 1];
        cairn_server_announce(srv, replica, id, sizeof id);
        fprintf(stderr, "cairn: shared cache %s, replica %s\n", cfg->service.shared->url, id);
    }
    print_banner_head(srv, cfg);
    fprintf(stderr, "cairn: listening on %s (%s)\n", where, acc->what);
    print_banner_tail(srv, cfg, cfg->n_credentials > 0 || strcmp(acc->what, "no authentication"));
    fflush(stderr);
    rc = cairn_server_run(srv);
    cairn_server_free(srv);
    fprintf(stderr, "cairn: stopped\n");
    return rc == CAIRN_OK ? 0 : 1;
}

int cmd_serve(int argc, char **argv)
{
    serve_opts o;
    int status = parse_serve_opts(&o, argc, argv);
    if (status != CLI_PROCEED)
        return status;
    access_opts acc;
    status = prepare_serve(&o, &acc);
    return status != CLI_PROCEED ? status : run_server(&o.cfg, &acc, o.shared.replica);
}
