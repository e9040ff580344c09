/*
 * cli/cmd_route.c — `cairn route`: the cache-aware router in front of
 * replicas (route/route.h; docs/scale-out.md "The router"). This file turns
 * options into a route_config; everything else is in route/.
 *
 * Once listening it prints one line containing "listening" and the bound
 * addresses to stderr, which is what scripts wait for.
 */
#include "cli/cli.h"
#include "route/route.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: cairn route -m MODEL [options]\n\n"
    "Routes the OpenAI HTTP API and the msgpack protocol to cairn replicas, each\n"
    "request to the replica that has the longest part of its prompt cached unless\n"
    "that one is loaded (docs/scale-out.md, \"The router\"). Reads the replicas'\n"
    "page events from Redis. Prints a line containing 'listening' once ready.\n\n"
    "  -m, --model FILE       the replicas' GGUF: only its vocabulary and chat template\n"
    "                         are read, to tokenize requests as the replicas do\n"
    "      --host ADDR        address to listen on (default 127.0.0.1)\n"
    "      --http-port N      HTTP port (default 8080; 0 = any free port; -1 = none)\n"
    "      --port N           msgpack-RPC port (default: none; 0 = any free port)\n"
    "      --shared-cache URL the replicas' Redis (their --shared-cache): redis://HOST:PORT\n"
    "                         or unix:///path; its stream of page events is read\n"
    "      --shared-prefix P  key prefix the replicas use (default cairn:)\n"
    "      --replica SPEC     a replica given here: http=HOST:PORT,rpc=HOST:PORT[,id=ID]\n"
    "                         (repeatable; others are found from their hello events)\n"
    "      --tenants FILE     the replicas' tenants file: the tenant of a request's token\n"
    "                         seeds its page hashes, as on the replicas\n"
    "      --policy P         cache (default) or round-robin\n"
    "      --work-weight W    extra weight of a request's own uncached prefill, the work\n"
    "                         the cluster does for it, against the queue (default 1)\n"
    "      --decode-weight W  prefill tokens one expected decode token weighs (default 4)\n"
    "      --decode-estimate N  expected decode tokens of a request (default 128; less when\n"
    "                         its max_tokens is less)\n"
    "      --predict-ttl S    how long a replica is assumed to hold a prompt the router\n"
    "                         sent it, without an event saying so (default 30)\n"
    "      --health-interval S  seconds between health checks (default 1)\n"
    "      --health-failures N  failed checks in a row that make a replica down (default 3)\n"
    "      --page-size N      page size of replicas whose events have not said (default 16)\n"
    "      --http-timeout S   an HTTP request must arrive whole within S seconds of the\n"
    "                         connection becoming idle (default 30)\n"
    "      --idle-timeout S   close a msgpack connection that sends half a message and\n"
    "                         then nothing for S seconds (default 60)\n"
    "      --http-max-body SIZE  largest request body (default 4M, as serve's: give both\n"
    "                         the same)\n"
    "  -v, --verbose          log more\n"
    "  -h, --help             this help\n";

enum {
    OPT_HOST = 4000, OPT_HTTP_PORT, OPT_PORT, OPT_REDIS, OPT_PREFIX, OPT_REPLICA, OPT_TENANTS,
    OPT_POLICY, OPT_DECODE_WEIGHT, OPT_DECODE_ESTIMATE, OPT_PREDICT_TTL, OPT_HEALTH_INTERVAL,
    OPT_HEALTH_FAILURES, OPT_PAGE_SIZE, OPT_WORK_WEIGHT, OPT_HTTP_TIMEOUT, OPT_IDLE_TIMEOUT, OPT_HTTP_MAX_BODY,
};

/* "http=H:P,rpc=H:P,id=X" -> spec (pointing into `text`, which it edits). */
static int parse_replica(char *text, route_replica_spec *spec)
{
    memset(spec, 0, sizeof *spec);
    for (char *save = NULL, *part = strtok_r(text, ",", &save); part;
         part = strtok_r(NULL, ",", &save)) {
        if (strncmp(part, "http=", 5) == 0)
            spec->http = part + 5;
        else if (strncmp(part, "rpc=", 4) == 0)
            spec->rpc = part + 4;
        else if (strncmp(part, "id=", 3) == 0)
            spec->id = part + 3;
        else
            return -1;
    }
    return spec->http || spec->rpc ? 0 : -1;
}

static int parse_double(const char *arg, const char *what, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(arg, &end);
    if (*end || end == arg || !(v >= lo && v <= hi)) {
        fprintf(stderr, "cairn route: %s must be a number in [%g, %g]\n", what, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_long(const char *arg, const char *what, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(arg, &end, 10);
    if (*end || end == arg || v < lo || v > hi) {
        fprintf(stderr, "cairn route: %s must be an integer in [%ld, %ld]\n", what, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cmd_route(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"host", required_argument, 0, OPT_HOST},
        {"http-port", required_argument, 0, OPT_HTTP_PORT},
        {"port", required_argument, 0, OPT_PORT},
        {"shared-cache", required_argument, 0, OPT_REDIS},
        {"shared-prefix", required_argument, 0, OPT_PREFIX},
        {"replica", required_argument, 0, OPT_REPLICA},
        {"tenants", required_argument, 0, OPT_TENANTS},
        {"policy", required_argument, 0, OPT_POLICY},
        {"decode-weight", required_argument, 0, OPT_DECODE_WEIGHT},
        {"work-weight", required_argument, 0, OPT_WORK_WEIGHT},
        {"decode-estimate", required_argument, 0, OPT_DECODE_ESTIMATE},
        {"predict-ttl", required_argument, 0, OPT_PREDICT_TTL},
        {"health-interval", required_argument, 0, OPT_HEALTH_INTERVAL},
        {"health-failures", required_argument, 0, OPT_HEALTH_FAILURES},
        {"page-size", required_argument, 0, OPT_PAGE_SIZE},
        {"http-timeout", required_argument, 0, OPT_HTTP_TIMEOUT},
        {"idle-timeout", required_argument, 0, OPT_IDLE_TIMEOUT},
        {"http-max-body", required_argument, 0, OPT_HTTP_MAX_BODY},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    route_config cfg;
    route_config_default(&cfg);
    cfg.model_path = CLI_DEFAULT_MODEL;
    route_replica_spec specs[ROUTE_MAX_REPLICAS];
    int n_specs = 0;
    long v;
    int opt;
    while ((opt = getopt_long(argc, argv, "m:vh", opts, NULL)) != -1) {
        switch (opt) {
        case 'm': cfg.model_path = optarg; break;
        case OPT_HOST: cfg.host = optarg; break;
        case OPT_HTTP_PORT:
            if (parse_long(optarg, "--http-port", -1, 65535, &v))
                return 2;
            cfg.http_port = (int)v;
            break;
        case OPT_PORT:
            if (parse_long(optarg, "--port", -1, 65535, &v))
                return 2;
            cfg.rpc_port = (int)v;
            break;
        case OPT_REDIS: cfg.redis_url = optarg; break;
        case OPT_PREFIX: cfg.prefix = optarg; break;
        case OPT_REPLICA:
            if (n_specs == ROUTE_MAX_REPLICAS || parse_replica(optarg, &specs[n_specs])) {
                fprintf(stderr, "cairn route: --replica must be http=HOST:PORT,rpc=HOST:PORT[,id=ID]"
                                " (at most %d)\n", ROUTE_MAX_REPLICAS);
                return 2;
            }
            n_specs++;
            break;
        case OPT_TENANTS: cfg.tenants_path = optarg; break;
        case OPT_POLICY:
            if (strcmp(optarg, "cache") == 0)
                cfg.policy = ROUTE_POLICY_CACHE;
            else if (strcmp(optarg, "round-robin") == 0)
                cfg.policy = ROUTE_POLICY_ROUND_ROBIN;
            else {
                fprintf(stderr, "cairn route: --policy must be cache or round-robin\n");
                return 2;
            }
            break;
        case OPT_DECODE_WEIGHT:
            if (parse_double(optarg, "--decode-weight", 0, 1e6, &cfg.weights.decode))
                return 2;
            break;
        case OPT_WORK_WEIGHT:
            if (parse_double(optarg, "--work-weight", 0, 1e6, &cfg.weights.work))
                return 2;
            break;
        case OPT_DECODE_ESTIMATE:
            if (parse_long(optarg, "--decode-estimate", 0, 1 << 24, &v))
                return 2;
            cfg.decode_estimate = v;
            break;
        case OPT_PREDICT_TTL:
            if (parse_double(optarg, "--predict-ttl", 0, 1e7, &cfg.predict_ttl_s))
                return 2;
            break;
        case OPT_HEALTH_INTERVAL:
            if (parse_double(optarg, "--health-interval", 0.01, 3600, &cfg.health_interval_s))
                return 2;
            break;
        case OPT_HEALTH_FAILURES:
            if (parse_long(optarg, "--health-failures", 1, 1000, &v))
                return 2;
            cfg.health_failures = (int)v;
            break;
        case OPT_PAGE_SIZE:
            if (parse_long(optarg, "--page-size", 1, 1 << 16, &v))
                return 2;
            cfg.page_size = (int)v;
            break;
        case OPT_HTTP_TIMEOUT:
            if (parse_double(optarg, "--http-timeout", 0.01, 1e7, &cfg.http_timeout_s))
                return 2;
            break;
        case OPT_IDLE_TIMEOUT:
            if (parse_double(optarg, "--idle-timeout", 0.01, 1e7, &cfg.idle_timeout_s))
                return 2;
            break;
        case OPT_HTTP_MAX_BODY: {
            char *end;
            double v = strtod(optarg, &end);
            double mult = *end == 'K' || *end == 'k'   ? 1024.0
                          : *end == 'M' || *end == 'm' ? 1024.0 * 1024
                          : *end == 'G' || *end == 'g' ? 1024.0 * 1024 * 1024
                                                       : 1.0;
            if (mult > 1.0)
                end++;
            if (end == optarg || *end || !(v > 0) || v * mult > 1e12) {
                fprintf(stderr, "cairn route: --http-max-body must be a size like 4M\n");
                return 2;
            }
            cfg.max_body_bytes = (size_t)(v * mult);
            break;
        }
        case 'v': cairn_log_set_level(CAIRN_LOG_DEBUG); break;
        default: return cli_help_or_usage(opt, help);
        }
    }
    int rc = cli_no_operands("route", argc, argv);
    if (rc != CLI_PROCEED)
        return rc;
    cfg.replicas = specs;
    cfg.n_replicas = n_specs;
    char err[512] = "";
    cairn_router *r = NULL;
    if ((rc = cairn_router_create(&cfg, &r, err, sizeof err)) != CAIRN_OK) {
        fprintf(stderr, "cairn route: %s\n", err[0] ? err : cairn_strerror(rc));
        return 1;
    }
    char http[80] = "", rpc[80] = "";
    if (cairn_router_http_port(r) >= 0)
        snprintf(http, sizeof http, " http %s:%d", cfg.host, cairn_router_http_port(r));
    if (cairn_router_rpc_port(r) >= 0)
        snprintf(rpc, sizeof rpc, " msgpack %s:%d", cfg.host, cairn_router_rpc_port(r));
    fprintf(stderr, "cairn route: listening on%s%s (policy %s, %d static replicas, events %s)\n",
            http, rpc, cfg.policy == ROUTE_POLICY_CACHE ? "cache" : "round-robin", n_specs,
            cfg.redis_url ? cfg.redis_url : "off");
    rc = cairn_router_run(r);
    cairn_router_free(r);
    return rc == CAIRN_OK ? 0 : 1;
}
