/*
 * server/http/metrics.c — GET /metrics: the engine's counters (cache.stats)
 * in Prometheus' text format, with the facade's own response counts.
 */
#include "server/http/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void metric_head(cairn_strbuf *b, const char *name, const char *type, const char *help)
{
    http_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_u64(cairn_strbuf *b, const char *name, const char *type, const char *help,
                       uint64_t v)
{
    metric_head(b, name, type, help);
    http_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

static void metric_f64(cairn_strbuf *b, const char *name, const char *type, const char *help,
                       double v)
{
    metric_head(b, name, type, help);
    http_printf(b, "%s %.9g\n", name, v);
}

static const char *const tier_names[4] = {"device", "host", "disk", "shared"};

/* One series per tier: the three local ones, or with n_tiers 4 also the
 * shared tier (Redis). */
static void metric_tiers_n(cairn_strbuf *b, const char *name, const char *type, const char *help,
                           const uint64_t *v, int n_tiers)
{
    metric_head(b, name, type, help);
    for (int t = 0; t < n_tiers; t++)
        http_printf(b, "%s{tier=\"%s\"} %llu\n", name, tier_names[t], (unsigned long long)v[t]);
}

static void metric_tiers(cairn_strbuf *b, const char *name, const char *type, const char *help,
                         const uint64_t v[3])
{
    metric_tiers_n(b, name, type, help, v, 3);
}

static void metric_histogram(cairn_strbuf *b, const char *name, const char *help,
                             const cairn_latency_histogram *hg)
{
    metric_head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < CAIRN_LATENCY_BUCKETS; i++) {
        cum += hg->counts[i];
        http_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, cairn_latency_bounds[i],
                  (unsigned long long)cum);
    }
    cum += hg->counts[CAIRN_LATENCY_BUCKETS];
    http_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    http_printf(b, "%s_sum %.9g\n", name, hg->sum_s);
    http_printf(b, "%s_count %llu\n", name, (unsigned long long)hg->count);
}

/* ---- vLLM's names ----------------------------------------------------------
 *
 * Routers and autoscalers written for vLLM (vllm-router, llm-d's endpoint
 * picker, KEDA/HPA rules, Grafana boards) read these; each has the meaning
 * vLLM gives it, for the whole server (vLLM has no tenants), labelled as vLLM
 * labels them: model_name (the id /v1/models reports) and engine="0". The
 * table in docs/openai.md says what each one counts in cairn. */

/* A label value in the text format: backslash, quote and newline escaped. */
static void label_value(cairn_strbuf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            cairn_strbuf_add(b, "\\\\", 2);
        else if (*v == '"')
            cairn_strbuf_add(b, "\\\"", 2);
        else if (*v == '\n')
            cairn_strbuf_add(b, "\\n", 2);
        else
            cairn_strbuf_add(b, v, 1);
    }
}

/* A bucket bound as Python's prometheus_client writes it ("0.5", "1.0",
 * "2560.0"), so that le labels equal vLLM's own series, string for string. */
static void bound_text(char *out, size_t cap, double v)
{
    if (v < 9e15 && v == (double)(long long)v)
        snprintf(out, cap, "%.1f", v);
    else
        snprintf(out, cap, "%.10g", v);
}

static void vllm_sample(cairn_strbuf *b, const char *name, const char *labels, double v)
{
    if (v >= 0 && v < 9e15 && v == (double)(long long)v)
        http_printf(b, "%s{%s} %lld\n", name, labels, (long long)v);
    else
        http_printf(b, "%s{%s} %.9g\n", name, labels, v);
}

static void vllm_metric(cairn_strbuf *b, const char *name, const char *type, const char *help,
                        const char *labels, double v)
{
    metric_head(b, name, type, help);
    vllm_sample(b, name, labels, v);
}

static void vllm_histogram(cairn_strbuf *b, const char *name, const char *help,
                           const char *labels, const cairn_vllm_histogram *hg, cairn_vllm_hist which)
{
    int n;
    const double *bounds = cairn_vllm_bounds(which, &n);
    metric_head(b, name, "histogram", help);
    uint64_t cum = 0;
    char le[32];
    for (int i = 0; i < n; i++) {
        cum += hg->counts[i];
        bound_text(le, sizeof le, bounds[i]);
        http_printf(b, "%s_bucket{%s,le=\"%s\"} %llu\n", name, labels, le,
                    (unsigned long long)cum);
    }
    cum += hg->counts[n];
    http_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels, (unsigned long long)cum);
    http_printf(b, "%s_sum{%s} %.9g\n", name, labels, hg->sum_s);
    http_printf(b, "%s_count{%s} %llu\n", name, labels, (unsigned long long)hg->count);
}

static void render_vllm(const char *model, const cairn_service_stats *st, cairn_strbuf *b)
{
    cairn_strbuf lb = {0};
    cairn_strbuf_add(&lb, "model_name=\"", 12);
    label_value(&lb, model);
    cairn_strbuf_add(&lb, "\",engine=\"0\"", 12);
    if (lb.oom) {
        cairn_strbuf_free(&lb);
        b->oom = true;
        return;
    }
    const char *l = lb.data;
    double usage = st->device_pages_total
                       ? (double)st->device_pages_in_use / (double)st->device_pages_total
                       : 0;

    vllm_metric(b, "vllm:num_requests_running", "gauge",
                "Requests in the running batch now.", l, (double)st->running);
    vllm_metric(b, "vllm:num_requests_waiting", "gauge",
                "Requests queued for the running batch now.", l, (double)st->waiting);
    vllm_metric(b, "vllm:kv_cache_usage_perc", "gauge",
                "Fraction of the KV-cache pages in use (0 to 1; 1 is full).", l, usage);
    vllm_metric(b, "vllm:gpu_cache_usage_perc", "gauge",
                "Old name of vllm:kv_cache_usage_perc (gone from vLLM 0.32), same value.", l,
                usage);
    vllm_metric(b, "vllm:prefix_cache_queries_total", "counter",
                "Prompt tokens looked up in the prefix cache.", l, (double)st->prompt_tokens);
    vllm_metric(b, "vllm:prefix_cache_hits_total", "counter",
                "Prompt tokens the prefix cache had (not computed).", l,
                (double)st->cached_tokens);
    vllm_metric(b, "vllm:gpu_prefix_cache_queries_total", "counter",
                "Old name of vllm:prefix_cache_queries (gone from vLLM 0.32), same value.", l,
                (double)st->prompt_tokens);
    vllm_metric(b, "vllm:gpu_prefix_cache_hits_total", "counter",
                "Old name of vllm:prefix_cache_hits (gone from vLLM 0.32), same value.", l,
                (double)st->cached_tokens);
    vllm_metric(b, "vllm:num_preemptions_total", "counter",
                "Requests the engine preempted (paused for lack of KV pages).", l,
                (double)st->paused);
    vllm_metric(b, "vllm:prompt_tokens_total", "counter",
                "Prompt tokens of admitted requests, cached ones included.", l,
                (double)st->prompt_tokens);
    vllm_metric(b, "vllm:prompt_tokens_cached_total", "counter",
                "Prompt tokens taken from a cache instead of computed.", l,
                (double)st->cached_tokens);
    /* vLLM's sources: computed here, found in this server's own cache, or
     * brought in from outside it (cairn's shared tier, Redis) */
    const uint64_t *by_tier = st->cached_tokens_by_tier;
    uint64_t external = by_tier[3] < st->cached_tokens ? by_tier[3] : st->cached_tokens;
    uint64_t own = st->cached_tokens - external;
    uint64_t computed = st->prompt_tokens > st->cached_tokens
                            ? st->prompt_tokens - st->cached_tokens : 0;
    metric_head(b, "vllm:prompt_tokens_by_source_total", "counter",
                "Prompt tokens by where their KV came from.");
    http_printf(b, "vllm:prompt_tokens_by_source_total{%s,source=\"local_compute\"} %llu\n", l,
                (unsigned long long)computed);
    http_printf(b, "vllm:prompt_tokens_by_source_total{%s,source=\"local_cache_hit\"} %llu\n",
                l, (unsigned long long)own);
    http_printf(b,
                "vllm:prompt_tokens_by_source_total{%s,source=\"external_kv_transfer\"} %llu\n",
                l, (unsigned long long)external);
    /* vLLM's tiers in its order; cairn has no peer-to-peer transfer, and its
     * shared tier is a store vLLM would call unspecified */
    metric_head(b, "vllm:prompt_tokens_cached_by_source_total", "counter",
                "Cached prompt tokens by the cache tier that held them.");
    static const struct {
        const char *source;
        int tier; /* index into cached_tokens_by_tier; -1: none in cairn */
    } sources[] = {{"device", 0}, {"host", 1}, {"p2p", -1}, {"disk", 2},
                   {"external_unspecified", 3}};
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++)
        http_printf(b, "vllm:prompt_tokens_cached_by_source_total{%s,source=\"%s\"} %llu\n", l,
                    sources[i].source,
                    sources[i].tier < 0 ? 0ULL : (unsigned long long)by_tier[sources[i].tier]);
    vllm_metric(b, "vllm:generation_tokens_total", "counter", "Tokens generated.", l,
                (double)st->generated_tokens);
    metric_head(b, "vllm:request_success_total", "counter",
                "Requests that ended, by why they ended.");
    static const char *const reasons[CAIRN_VLLM_FINISHES] = {"stop", "length", "abort",
                                                             "error"};
    for (int r = 0; r < CAIRN_VLLM_FINISHES; r++)
        http_printf(b, "vllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", l,
                    reasons[r], (unsigned long long)st->finished[r]);
    /* vLLM's fifth reason (a repetitive pattern cut short): never in cairn,
     * written so that the series are vLLM's */
    http_printf(b, "vllm:request_success_total{%s,finished_reason=\"repetition\"} 0\n", l);
    metric_head(b, "vllm:cache_config_info", "gauge",
                "The KV cache's settings as labels; the value is always 1.");
    http_printf(b,
                "vllm:cache_config_info{block_size=\"%d\",enable_prefix_caching=\"%s\","
                "engine=\"0\",num_gpu_blocks=\"%llu\"} 1\n",
                st->page_size, st->prefix_cache ? "True" : "False",
                (unsigned long long)st->device_pages_total);
    vllm_histogram(b, "vllm:time_to_first_token_seconds",
                   "Seconds from a request's arrival to its first token.", l,
                   &st->vllm[CAIRN_VLLM_TTFT], CAIRN_VLLM_TTFT);
    vllm_histogram(b, "vllm:inter_token_latency_seconds",
                   "Seconds between a request's consecutive decode steps.", l,
                   &st->vllm[CAIRN_VLLM_ITL], CAIRN_VLLM_ITL);
    vllm_histogram(b, "vllm:time_per_output_token_seconds",
                   "Old name of vllm:inter_token_latency_seconds (gone from vLLM 0.32), same "
                   "observations.",
                   l, &st->vllm[CAIRN_VLLM_ITL], CAIRN_VLLM_ITL);
    vllm_histogram(b, "vllm:request_time_per_output_token_seconds",
                   "Per request: its decode seconds over its tokens after the first.", l,
                   &st->vllm[CAIRN_VLLM_TPOT], CAIRN_VLLM_TPOT);
    vllm_histogram(b, "vllm:e2e_request_latency_seconds",
                   "Seconds from a request's arrival to its end.", l, &st->vllm[CAIRN_VLLM_E2E],
                   CAIRN_VLLM_E2E);
    vllm_histogram(b, "vllm:request_queue_time_seconds",
                   "Seconds a request waited before it was first scheduled.", l,
                   &st->vllm[CAIRN_VLLM_QUEUE], CAIRN_VLLM_QUEUE);
    vllm_histogram(b, "vllm:request_prefill_time_seconds",
                   "Seconds from a request's first scheduling to its first token.", l,
                   &st->vllm[CAIRN_VLLM_PREFILL], CAIRN_VLLM_PREFILL);
    vllm_histogram(b, "vllm:request_decode_time_seconds",
                   "Seconds from a request's first token to its last.", l,
                   &st->vllm[CAIRN_VLLM_DECODE], CAIRN_VLLM_DECODE);
    vllm_histogram(b, "vllm:request_inference_time_seconds",
                   "Seconds from a request's first scheduling to its last token.", l,
                   &st->vllm[CAIRN_VLLM_INFERENCE], CAIRN_VLLM_INFERENCE);
    cairn_strbuf_free(&lb);
}

static void render_metrics(srv_http *h, const cairn_service_stats *st, cairn_strbuf *b)
{
    metric_u64(b, "cairn_requests_running", "gauge",
               "Generation requests running (or fetching their prefix) now.", st->running);
    metric_u64(b, "cairn_requests_waiting", "gauge", "Generation requests waiting to run.",
               st->waiting);
    metric_u64(b, "cairn_requests_total", "counter", "Generation requests admitted.",
               st->queries);
    metric_u64(b, "cairn_requests_paused_total", "counter",
               "Requests paused for lack of KV pages.", st->paused);
    metric_u64(b, "cairn_prompt_tokens_total", "counter",
               "Prompt tokens of admitted requests (prefix-cache query tokens).",
               st->prompt_tokens);
    metric_u64(b, "cairn_generation_tokens_total", "counter", "Tokens generated.",
               st->generated_tokens);
    metric_u64(b, "cairn_prefix_cache_queries_total", "counter",
               "Prompt tokens looked up in the prefix cache.", st->prompt_tokens);
    metric_u64(b, "cairn_prefix_cache_hits_total", "counter",
               "Prompt tokens served from the prefix cache (not computed).", st->cached_tokens);
    metric_u64(b, "cairn_prefix_cache_partial_tokens_total", "counter",
               "Of those, tokens reused from part of a page (copied rows).", st->partial_tokens);
    metric_u64(b, "cairn_prefix_shared_waits_total", "counter",
               "Requests that waited for another to compute the prefix they share.",
               st->shared_waits);
    metric_u64(b, "cairn_prefix_remote_waits_total", "counter",
               "Requests that waited for another replica to compute the prefix they share "
               "(its pages came through the shared tier).",
               st->remote_waits);
    metric_u64(b, "cairn_prefix_remote_wait_timeouts_total", "counter",
               "Of those, waits given up after --shared-wait seconds without new pages.",
               st->remote_wait_timeouts);
    metric_tiers_n(b, "cairn_prefix_cache_hit_tokens_total", "counter",
                   "Prompt tokens served from the prefix cache, by the tier they were in.",
                   st->cached_tokens_by_tier, 4);
    uint64_t v[3];
    for (int t = 0; t < 3; t++)
        v[t] = st->tiers[t].hit_tokens;
    metric_tiers(b, "cairn_kv_tier_lookup_hit_tokens_total", "counter",
                 "Tokens of prefix lookups that found their pages in this tier.", v);
    for (int t = 0; t < 3; t++)
        v[t] = st->tiers[t].miss_tokens;
    metric_tiers(b, "cairn_kv_tier_lookup_miss_tokens_total", "counter",
                 "Tokens of prefix lookups that reached this tier and missed.", v);
    metric_tiers(b, "cairn_kv_tree_pages", "gauge",
                 "KV pages of the prefix tree, by the tier they are in.", st->pages);
    for (int t = 0; t < 3; t++)
        v[t] = st->tiers[t].pages;
    metric_tiers(b, "cairn_kv_pages_used", "gauge", "KV pages held by each tier.", v);
    for (int t = 0; t < 3; t++)
        v[t] = st->tiers[t].bytes;
    metric_tiers(b, "cairn_kv_bytes_used", "gauge", "Bytes of KV pages held by each tier.", v);
    metric_u64(b, "cairn_kv_device_pages_total", "gauge", "Tier-0 KV pages in the pool.",
               st->device_pages_total);
    metric_u64(b, "cairn_kv_device_pages_free", "gauge", "Tier-0 KV pages free now.",
               st->device_pages_free);
    metric_u64(b, "cairn_kv_evicted_pages_total", "counter", "Pages moved out of tier 0.",
               st->evicted_pages);
    metric_u64(b, "cairn_sessions", "gauge", "Open sessions (stored Responses apart).",
               st->sessions);
    metric_u64(b, "cairn_stored_responses", "gauge",
               "Stored Responses kept (store: true; bounded by --max-responses).",
               st->stored_responses);
    metric_u64(b, "cairn_pinned_tokens", "gauge",
               "Tokens of the prefixes retention hints keep cached now (cache_control, "
               "prompt_cache_retention, cache_pin).", st->pinned_tokens);
    metric_u64(b, "cairn_pinned_prefixes", "gauge", "Prefixes retention hints keep now.",
               st->pinned_prefixes);
    metric_u64(b, "cairn_pins_refused_total", "counter",
               "Retention hints refused at a tenant's or the global bound.", st->pins_refused);
    metric_u64(b, "cairn_kv_write_behind_pages_total", "counter",
               "Pages of reused prefixes written to the disk tier in the background "
               "(committed: they survive a kill).", st->behind.pages);
    metric_u64(b, "cairn_kv_write_behind_queued_pages_total", "counter",
               "Pages of reused prefixes queued for the disk tier in the background.",
               st->behind.queued);
    metric_u64(b, "cairn_kv_write_behind_waiting", "gauge",
               "Reused prefixes waiting to be written to the disk tier.", st->behind.waiting);
    metric_u64(b, "cairn_kv_write_behind_dropped_total", "counter",
               "Reused prefixes not queued for the disk tier (queue full).", st->behind.dropped);
    metric_f64(b, "cairn_kv_write_behind_engine_seconds_total", "counter",
               "Engine-thread time spent copying pages for write-behind (the disk's I/O "
               "thread commits them).", st->behind.seconds);
    if (st->shared.on) {
        metric_u64(b, "cairn_shared_up", "gauge",
                   "1 while the shared cache tier's (Redis) connection is up.", st->shared.up);
        metric_u64(b, "cairn_shared_read_hits_total", "counter",
                   "Page reads that missed locally and were served by the shared tier.",
                   st->shared.hits);
        metric_u64(b, "cairn_shared_read_misses_total", "counter",
                   "Page reads that missed locally and in the shared tier.", st->shared.misses);
        metric_u64(b, "cairn_shared_corrupt_total", "counter",
                   "Shared-tier values that failed their checks (deleted, recomputed).",
                   st->shared.corrupt);
        metric_u64(b, "cairn_shared_pages_queued_total", "counter",
                   "Pages this replica queued for the shared tier.", st->shared.pages_queued);
        metric_u64(b, "cairn_shared_writes_total", "counter",
                   "Values (pages and session records) the shared tier stored.", st->shared.puts);
        metric_u64(b, "cairn_shared_dropped_total", "counter",
                   "Writes and events dropped (queue full while the shared tier was away).",
                   st->shared.dropped);
        metric_u64(b, "cairn_shared_errors_total", "counter",
                   "Commands the shared tier refused (e.g. out of memory).", st->shared.errors);
        metric_u64(b, "cairn_shared_events_total", "counter",
                   "Page events published for the router.", st->shared.events);
        metric_u64(b, "cairn_shared_outages_total", "counter",
                   "Times a connection to the shared tier went down.", st->shared.outages);
        metric_u64(b, "cairn_shared_queued_bytes", "gauge",
                   "Bytes waiting to be written to the shared tier.", st->shared.queued_bytes);
    }
    if (st->kv_events.on) {
        metric_u64(b, "cairn_kv_events_published_total", "counter",
                   "KV events (vLLM's format) sent to the routers.", st->kv_events.events);
        metric_u64(b, "cairn_kv_events_batches_total", "counter",
                   "Event batches sent (one ZMQ message each).", st->kv_events.batches);
        metric_u64(b, "cairn_kv_events_dropped_total", "counter",
                   "KV events dropped because the publisher's queue was full.",
                   st->kv_events.dropped);
        metric_u64(b, "cairn_kv_events_resyncs_total", "counter",
                   "Full re-announcements of the cache after dropped events.",
                   st->kv_events.resyncs);
        metric_u64(b, "cairn_kv_events_replays_total", "counter",
                   "Replay requests answered (a router catching up).", st->kv_events.replays);
    }
    metric_histogram(b, "cairn_time_to_first_token_seconds",
                     "From a request's submission to its first sampled token.", &st->ttft);
    metric_histogram(b, "cairn_inter_token_latency_seconds",
                     "Between consecutive tokens of a request.", &st->inter_token);
    metric_head(b, "cairn_http_responses_total", "counter",
                "HTTP responses sent by the OpenAI facade, by status code.");
    for (int i = 0; i < HTTP_N_STATUS_SLOTS && h->status_counts[i].code; i++)
        http_printf(b, "cairn_http_responses_total{code=\"%d\"} %llu\n", h->status_counts[i].code,
                  (unsigned long long)h->status_counts[i].n);
}

/* Why prompts were recomputed (docs/why-recomputed.md): the final reasons
 * of the generations this server answered (HTTP and native), every reason
 * listed so a dashboard sees zeros; explains asked without running apart. */
static void render_misses(const cairn_server *srv, const cairn_service_stats *st, cairn_strbuf *b)
{
    metric_head(b, "cairn_prompt_cache_misses_total", "counter",
                "Generations whose prompt was not all cached, by why.");
    for (int r = CAIRN_MISS_NONE + 1; r < CAIRN_MISS_REASONS; r++)
        if (r != CAIRN_MISS_DEPARTED)
            http_printf(b, "cairn_prompt_cache_misses_total{reason=\"%s\"} %llu\n",
                        cairn_miss_reason_name((cairn_miss_reason)r),
                        (unsigned long long)srv->misses[r]);
    metric_u64(b, "cairn_prompt_cache_explains_total", "counter",
               "Cache explanations asked without running the prompt.", st->explains);
}

void http_metrics_answer(hconn *c, const cairn_service_stats *st)
{
    hreq *q = c->active;
    c->active = NULL;
    cairn_strbuf b = {0};
    render_metrics(c->base.srv->http, st, &b);
    render_misses(c->base.srv, st, &b);
    render_vllm(c->base.srv->model_id, st, &b);
    if (b.oom)
        http_respond_error(c, 503, "out of memory", NULL, NULL);
    else
        http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len, NULL);
    cairn_strbuf_free(&b);
    http_request_free(q);
}

void http_handle_metrics(hconn *c)
{
    hreq *q = calloc(1, sizeof *q);
    hchoice *ch = calloc(1, sizeof *ch);
    cairn_request *r = q && ch ? cairn_request_new(CAIRN_REQ_CACHE_STATS) : NULL;
    if (!r) {
        free(q);
        free(ch);
        http_respond_error(c, 503, "out of memory", NULL, NULL);
        return;
    }
    q->kind = HK_METRICS;
    q->choices = ch;
    q->n_choices = 1;
    ch->msgid = ++c->next_msgid;
    r->id = ch->msgid;
    c->active = q;
    if (srv_submit(&c->base, r) != CAIRN_OK) {
        c->active = NULL;
        http_respond_error(c, 503, "the engine is not accepting requests", NULL, NULL);
        http_request_free(q);
    }
}
