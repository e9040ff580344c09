/*
 * session/events.c — what leaves the engine thread: events to the owner's
 * callback, the latency histograms of /metrics, and the counters of
 * cache.stats (session.h).
 */
#include "session/session_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Seconds; wide enough for a CPU model's first token and a GPU's next one. */
const double cairn_latency_bounds[CAIRN_LATENCY_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5,   1,      2.5,   5,    10,    25,   60,  120};

void svc_histogram_observe(cairn_latency_histogram *h, double seconds)
{
    if (!(seconds >= 0))
        seconds = 0; /* a clock step backwards counts as instant */
    int b = 0;
    while (b < CAIRN_LATENCY_BUCKETS && seconds > cairn_latency_bounds[b])
        b++;
    h->counts[b]++;
    h->count++;
    h->sum_s += seconds;
}

/* vLLM's boundaries (vllm/v1/metrics/loggers.py): time to first token; the
 * per-token pair (inter-token latency, time per output token); and the one
 * set its per-request times share (e2e, queue, prefill, decode, inference). */
static const double vllm_ttft_bounds[] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double vllm_itl_bounds[] = {
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double vllm_request_bounds[] = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,    10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

#define N_OF(a) ((int)(sizeof(a) / sizeof(a)[0]))

const double *cairn_vllm_bounds(cairn_vllm_hist h, int *n)
{
    switch (h) {
    case CAIRN_VLLM_TTFT:
        *n = N_OF(vllm_ttft_bounds);
        return vllm_ttft_bounds;
    case CAIRN_VLLM_ITL:
    case CAIRN_VLLM_TPOT:
        *n = N_OF(vllm_itl_bounds);
        return vllm_itl_bounds;
    default:
        *n = N_OF(vllm_request_bounds);
        return vllm_request_bounds;
    }
}

void svc_vllm_observe(cairn_service *s, cairn_vllm_hist which, double seconds)
{
    if (!(seconds >= 0))
        seconds = 0;
    int n;
    const double *bounds = cairn_vllm_bounds(which, &n);
    cairn_vllm_histogram *h = &s->stats.vllm[which];
    int b = 0;
    while (b < n && seconds > bounds[b])
        b++;
    h->counts[b]++;
    h->count++;
    h->sum_s += seconds;
}

/* A request ended (and is answered): its reason and its per-request times. */
void svc_note_finished(cairn_service *s, const job *j)
{
    cairn_vllm_finish why = CAIRN_VLLM_FINISH_STOP;
    if (j->finish && strcmp(j->finish, "cancelled") == 0)
        why = CAIRN_VLLM_FINISH_ABORT;
    else if (j->finish && strcmp(j->finish, "error") == 0)
        why = CAIRN_VLLM_FINISH_ERROR;
    else if (j->finish && strcmp(j->finish, "length") == 0)
        why = CAIRN_VLLM_FINISH_LENGTH;
    s->stats.finished[why]++;
    svc_vllm_observe(s, CAIRN_VLLM_E2E, cairn_now() - j->req->submitted_at);
    if (j->t_admitted > 0 && j->t_first_token >= j->t_admitted) {
        svc_vllm_observe(s, CAIRN_VLLM_QUEUE, j->t_admitted - j->req->submitted_at);
        svc_vllm_observe(s, CAIRN_VLLM_PREFILL, j->t_first_token - j->t_admitted);
        svc_vllm_observe(s, CAIRN_VLLM_DECODE, j->t_last_token - j->t_first_token);
        svc_vllm_observe(s, CAIRN_VLLM_INFERENCE, j->t_last_token - j->t_admitted);
        /* the first token belongs to the prefill, so it is not one of the
         * tokens the decode time is shared by */
        double decode = j->t_last_token - j->t_first_token;
        svc_vllm_observe(s, CAIRN_VLLM_TPOT, j->n_gen > 1 ? decode / (j->n_gen - 1) : 0);
    }
}

/* Distinct tier-0 pages in the page tables of the running jobs (a prefix
 * several share counts once). */
static uint64_t device_pages_in_use(const cairn_service *s, uint64_t capacity)
{
    if (capacity == 0)
        return 0;
    uint8_t *seen = calloc((size_t)(capacity + 7) / 8, 1);
    uint64_t n = 0;
    for (int i = 0; i < s->n_running; i++) {
        const job *j = s->running[i];
        for (size_t k = 0; k < j->n_pages; k++) {
            int32_t p = j->pages[k];
            if (p < 0 || (uint64_t)p >= capacity)
                continue;
            if (!seen) { /* out of memory: count without the de-duplication */
                n++;
                continue;
            }
            if (!(seen[p >> 3] & (1u << (p & 7)))) {
                seen[p >> 3] |= (uint8_t)(1u << (p & 7));
                n++;
            }
        }
    }
    free(seen);
    return n < capacity ? n : capacity;
}

void svc_emit(cairn_service *s, cairn_event *ev)
{
    if (s->cfg.on_event)
        s->cfg.on_event(ev, s->cfg.user);
}

void svc_emit_error(cairn_service *s, const cairn_request *r, int code, const char *msg)
{
    cairn_event ev = {.kind = CAIRN_EV_ERROR, .client = r->client, .id = r->id, .code = code,
                      .message = msg};
    svc_emit(s, &ev);
}

void svc_emit_session(cairn_service *s, const cairn_request *r, cairn_session_id id,
                      int64_t n_tokens)
{
    cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_SESSION, .client = r->client,
                      .id = r->id, .session = id, .n_session_tokens = n_tokens};
    svc_emit(s, &ev);
}

void svc_emit_generation_done(cairn_service *s, job *j)
{
    cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_GENERATION,
                      .client = j->req->client, .id = j->req->id, .text = j->text ? j->text : "",
                      .text_len = j->text_len, .tokens = j->seq.v + j->n_prompt,
                      .n_tokens = (size_t)j->n_gen, .finish_reason = j->finish,
                      .eog_token = j->eog_token, .stop_string = j->stop_string,
                      .logprobs = j->lps, .n_top = j->lps ? j->req->gen.sampling.n_logprobs : 0,
                      .prompt_tokens = (int64_t)j->n_prompt,
                      .cached_tokens = j->cached_tokens, .completion_tokens = j->n_gen,
                      .miss = j->miss,
                      .spec_forwards = j->spec_forwards, .spec_tokens = j->spec_tokens};
    if (j->spec && j->spec_forwards > 0) {
        cairn_spec_stats st;
        cairn_spec_seq_stats(j->spec, &st);
        ev.spec_drafted = st.drafted;
        ev.spec_accepted = st.accepted;
        snprintf(ev.spec_method, sizeof ev.spec_method, "%s", cairn_spec_seq_describe(j->spec));
    }
    memcpy(ev.cached_by_tier, j->cached_by_tier, sizeof ev.cached_by_tier);
    /* prompt: admission to the first token; decode: first token to the last */
    if (j->t_admitted > 0 && j->t_first_token >= j->t_admitted) {
        ev.prompt_seconds = j->t_first_token - j->t_admitted;
        ev.decode_seconds = j->t_last_token - j->t_first_token;
    }
    svc_emit(s, &ev);
}

void svc_fill_stats(cairn_service *s, cairn_service_stats *st)
{
    *st = s->stats;
    cairn_kvcache_stats ks;
    cairn_kvcache_get_stats(s->cache, &ks);
    for (int t = 0; t < 3; t++)
        st->pages[t] = ks.tree_pages[t];
    st->device_pages_total = ks.tier[CAIRN_TIER_DEVICE].capacity_pages;
    st->device_pages_free = ks.tier[CAIRN_TIER_DEVICE].free_pages;
    st->evicted_pages = ks.evicted_pages[CAIRN_TIER_DEVICE];
    st->running = (uint64_t)(s->n_running + s->n_fetching);
    st->device_pages_in_use = device_pages_in_use(s, st->device_pages_total);
    st->page_size = s->page_size;
    st->prefix_cache = s->prefix_cache;
    for (int t = 0; t < 3; t++) {
        const cairn_kvcache_tier_stats *k = &ks.tier[t];
        st->tiers[t] = (cairn_service_tier_stats){
            .pages = k->pages, .bytes = k->bytes, .hit_tokens = k->hit_tokens,
            .miss_tokens = k->miss_tokens, .evicted_pages = k->evicted_pages,
            .promoted_pages = k->promoted_pages, .load_ops = k->load_ops,
            .store_ops = k->store_ops, .load_mean_s = k->load_mean_s,
            .store_mean_s = k->store_mean_s};
    }
    st->waiting = s->n_waiting;
    st->sessions = s->n_sessions - s->n_responses;
    st->stored_responses = s->n_responses;
    pins_stats(s, &st->pinned_tokens, &st->pinned_prefixes);
    st->behind.pages = ks.behind_pages;
    st->behind.queued = ks.behind_queued_pages;
    st->behind.waiting = ks.behind_waiting;
    st->behind.dropped = ks.behind_dropped;
    st->behind.seconds = ks.behind_seconds;
    if (ks.shared.on) {
        st->shared.on = true;
        st->shared.up = ks.shared.up;
        st->shared.hits = ks.shared.hits;
        st->shared.misses = ks.shared.misses;
        st->shared.corrupt = ks.shared.corrupt;
        st->shared.puts = ks.shared.puts;
        st->shared.dropped = ks.shared.dropped;
        st->shared.errors = ks.shared.errors;
        st->shared.events = ks.shared.events;
        st->shared.outages = ks.shared.outages;
        st->shared.queued_bytes = ks.shared.queued_bytes;
        st->shared.pages_queued = ks.shared_pages_queued;
    }
    if (s->kv_events) {
        cairn_kv_events_stats es;
        cairn_kv_events_get_stats(s->kv_events, &es);
        st->kv_events.on = true;
        st->kv_events.events = es.published_events;
        st->kv_events.batches = es.published_batches;
        st->kv_events.dropped = es.dropped_events;
        st->kv_events.replays = es.replay_requests;
        st->kv_events.resyncs = s->kv_resyncs;
    }
}

void svc_log_cache_account(cairn_service *s)
{
    cairn_kvcache_stats ks;
    cairn_kvcache_get_stats(s->cache, &ks);
    static const char *names[3] = {"device", "host", "disk"};
    for (int t = 0; t < 3; t++) {
        const cairn_kvcache_tier_stats *k = &ks.tier[t];
        cairn_log(CAIRN_LOG_INFO,
                  "cache %s: %llu pages (%.1f MiB), hits %llu / misses %llu tokens, "
                  "%llu evicted, %llu promoted, load %.3f ms x %llu, store %.3f ms x %llu",
                  names[t], (unsigned long long)k->pages, (double)k->bytes / (1 << 20),
                  (unsigned long long)k->hit_tokens, (unsigned long long)k->miss_tokens,
                  (unsigned long long)k->evicted_pages, (unsigned long long)k->promoted_pages,
                  k->load_mean_s * 1e3, (unsigned long long)k->load_ops,
                  k->store_mean_s * 1e3, (unsigned long long)k->store_ops);
    }
}
