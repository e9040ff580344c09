/*
 * session/events.c — what leaves the engine thread: events to the owner's
 * callback, the latency histograms of /metrics, and the counters of
 * cache.stats (session.h).
 */
#include "session/session_impl.h"

#include <stdio.h>

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
    st->sessions = s->n_sessions;
    st->behind.pages = ks.behind_pages;
    st->behind.queued = ks.behind_queued_pages;
    st->behind.waiting = ks.behind_waiting;
    st->behind.dropped = ks.behind_dropped;
    st->behind.seconds = ks.behind_seconds;
    cairn_disk *d = cairn_kvcache_disk(s->cache);
    if (cairn_disk_has_shared(d)) {
        cairn_disk_stats ds;
        cairn_disk_get_stats(d, &ds);
        st->shared.on = true;
        st->shared.up = ds.shared_up;
        st->shared.hits = ds.shared_hits;
        st->shared.misses = ds.shared_misses;
        st->shared.corrupt = ds.shared_corrupt;
        st->shared.puts = ds.shared_puts;
        st->shared.dropped = ds.shared_dropped;
        st->shared.errors = ds.shared_errors;
        st->shared.events = ds.shared_events;
        st->shared.outages = ds.shared_outages;
        st->shared.queued_bytes = ds.shared_queued_bytes;
        st->shared.pages_queued = ks.shared_pages_queued;
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
