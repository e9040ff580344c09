/*
 * session/service.c — the engine thread itself: its inbox, its loop, and
 * the service's start and stop (session.h; the other files of session/ are
 * listed in session_impl.h).
 */
#include "session/session_impl.h"

#include <errno.h>
#include <math.h>
#include <time.h>

#include <stdio.h>
#include <unistd.h>

/* ---- the engine thread --------------------------------------------------------- */

/* Everything in the inbox now (NULL when empty), the inbox left empty. */
static cairn_request **take_inbox(cairn_service *s, size_t *n)
{
    *n = s->inbox_n;
    if (*n == 0)
        return NULL;
    cairn_request **in = malloc(*n * sizeof *in);
    if (!in) {
        *n = 0; /* try again next round */
        return NULL;
    }
    memcpy(in, s->inbox, *n * sizeof *in);
    s->inbox_n = 0;
    return in;
}

/* Stopping: running jobs give their computed pages to the tree (so they are
 * flushed to disk by stop); nothing more is emitted. */
static void drop_all_work(cairn_service *s)
{
    while (s->n_running)
        job_finish(s, s->running[--s->n_running], false);
    job *j;
    while ((j = waiting_pop(s)))
        job_finish(s, j, false);
    while (s->n_fetching)
        job_free(s->fetching[--s->n_fetching]);
    while ((j = s->durable)) {
        s->durable = j->next;
        job_free(j);
    }
    while (s->deferred) {
        deferred *d = s->deferred;
        s->deferred = d->next;
        cairn_request_free(d->req);
        free(d);
    }
    while (s->lookups) {
        lookup *l = s->lookups;
        s->lookups = l->next;
        cairn_request_free(l->req);
        free(l);
    }
}

static void *engine_main(void *arg)
{
    cairn_service *s = arg;
    for (;;) {
        /* Disk and copy work finishes on the store's thread: while any is
         * outstanding the loop polls for it instead of sleeping on the
         * condition variable. */
        bool io = s->n_fetching || s->durable || s->deferred || s->lookups ||
                  cairn_kvcache_busy(s->cache); /* write-behind goes on while idle */
        /* a pin that expires is unlocked on time even while nothing runs:
         * the idle wait ends at the next deadline */
        double next_pin = pins_sweep(s, cairn_now());
        /* jobs that wait for another replica's pages are fetched again on
         * time, too */
        const double ready_at = sched_ready_at(s);
        if (ready_at < next_pin)
            next_pin = ready_at;
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->inbox_n == 0 && s->n_running == 0 && ready_at > 0 && !io) {
            if (isinf(next_pin)) {
                pthread_cond_wait(&s->cv, &s->mu);
                continue;
            }
            double left = next_pin - cairn_now();
            if (left <= 0)
                break;
            struct timespec at;
            clock_gettime(CLOCK_REALTIME, &at);
            if (left > 3600)
                left = 3600; /* far deadlines: wake and look again */
            long long ns = (long long)at.tv_nsec + (long long)(left * 1e9);
            at.tv_sec += (time_t)(ns / 1000000000LL);
            at.tv_nsec = (long)(ns % 1000000000LL);
            if (pthread_cond_timedwait(&s->cv, &s->mu, &at) == ETIMEDOUT)
                break;
        }
        if (s->stopping) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        size_t n_in;
        cairn_request **in = take_inbox(s, &n_in);
        pthread_mutex_unlock(&s->mu);

        for (size_t i = 0; i < n_in; i++)
            intake_handle(s, in[i]);
        free(in);
        sched_poll_cache(s);
        sched_reap_cancelled(s);
        sched_admit(s);
        if (s->n_running)
            sched_step(s);
        else if (n_in == 0 && (s->n_fetching || s->durable || s->deferred || s->lookups ||
                               cairn_kvcache_busy(s->cache)))
            cairn_kvcache_wait(s->cache, 2);
    }
    drop_all_work(s);
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------ */

static int failf(char *err, size_t err_len, int rc, const char *msg)
{
    if (err && err_len && !err[0])
        snprintf(err, err_len, "%s", msg);
    return rc;
}

/* The configuration's defaults, and what the model was loaded for. */
static int settle_config(cairn_service *s, char *err, size_t err_len)
{
    cairn_service_config *c = &s->cfg;
    if (c->page_size <= 0)
        c->page_size = 16;
    if (!cairn_kv_type_supported(c->kv_type))
        return failf(err, err_len, CAIRN_EINVAL, "kv_type must be f16, bf16, f32, q8_0 or q4_0");
    if (c->prefill_chunk <= 0)
        c->prefill_chunk = 256;
    if (c->progress_ms == 0)
        c->progress_ms = 1000;
    if (c->max_sessions == 0)
        c->max_sessions = 4096;
    if (c->max_named_sessions == 0)
        c->max_named_sessions = 1024;
    if (c->max_responses == 0)
        c->max_responses = 10000;
    if (c->response_ttl_s == 0)
        c->response_ttl_s = 30.0 * 24 * 3600; /* OpenAI keeps them 30 days */
    /* the model's scratch is sized at load: a step may not exceed it */
    int mb = 0, ms = 0;
    cairn_model_limits(s->model, &mb, &ms);
    if (c->max_batch_tokens <= 0)
        c->max_batch_tokens = mb;
    if (c->max_seqs <= 0)
        c->max_seqs = ms < 32 ? ms : 32;
    if (c->max_seqs > c->max_batch_tokens)
        c->max_seqs = c->max_batch_tokens;
    if (c->max_batch_tokens > mb || c->max_seqs > ms) {
        snprintf(err, err_len, "the service's batch (%d tokens, %d sequences) exceeds what the "
                 "model was loaded for (%d, %d)", c->max_batch_tokens, c->max_seqs, mb, ms);
        return CAIRN_EINVAL;
    }
    const cairn_hparams *hp = cairn_model_hparams(s->model);
    s->n_vocab = hp->n_vocab;
    s->n_ctx = c->n_ctx > 0 ? c->n_ctx : hp->n_ctx_train;
    s->page_size = c->page_size;
    s->prefix_cache = !c->no_prefix_cache;
    return CAIRN_OK;
}

/* The page layout (with methods that keep KV: more layers for theirs) and
 * the draft settings, checked once here. */
static int setup_layout(cairn_service *s, char *err, size_t err_len)
{
    cairn_service_config *c = &s->cfg;
    int rc = s->spec ? cairn_spec_kv_layout(s->spec, c->page_size, c->kv_type, &s->kv)
                     : cairn_model_kv_layout(s->model, c->page_size, c->kv_type, &s->kv);
    if (rc) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "a KV cache of type %s does not fit this model (head_dim %d; q8_0 and q4_0 "
                 "need a multiple of 32)",
                 cairn_kv_type_name(c->kv_type), cairn_model_hparams(s->model)->head_dim);
        return failf(err, err_len, rc, msg);
    }
    if (!s->spec)
        return CAIRN_OK;
    const cairn_spec_params d = draft_override(cairn_spec_defaults(), &c->draft);
    s->draft = d;
    /* A draft model proposes, and catches up, one request at a time (its
     * forwards are not batched across requests), so beside other decoding
     * requests it costs more than it saves: measured on a 2-core Zen 4 with
     * 4 clients, 0.64x plain speculating up to 4 decoders, 0.81x up to 1
     * while its rows were kept up for every request; 1.00x up to 1 now that
     * they are computed only for a request expected to speculate
     * (bench/spec/bench_concurrent.py). Methods that cost nothing to
     * propose (suffix) gain there (1.13x). */
    const int def_max_batch = cairn_spec_method_mask(s->spec, "draft") ? 1 : 4;
    s->draft_max_batch = c->draft_max_batch == 0 ? def_max_batch
                         : c->draft_max_batch < 0 ? 0
                                                  : c->draft_max_batch;
    cairn_spec_seq *probe = NULL;
    if ((rc = cairn_spec_seq_create(s->spec, &d, NULL, 0, &probe))) {
        snprintf(err, err_len, "invalid draft settings: depth %d, top-k %d, n %d (n must be "
                 "below the batch size %d)", d.depth, d.top_k, d.n_draft, c->max_batch_tokens);
        return rc;
    }
    cairn_spec_seq_free(probe);
    if (cairn_spec_needs_features(s->spec)) {
        /* the final feature, or an EAGLE-3 head's layer states */
        const size_t dim = (size_t)cairn_model_feature_dim(s->model);
        s->features = malloc((size_t)c->max_batch_tokens * dim * sizeof(float));
        if (!s->features)
            return CAIRN_ENOMEM;
    }
    s->spec_jobs = calloc((size_t)c->max_seqs, sizeof *s->spec_jobs);
    if (!s->spec_jobs)
        return CAIRN_ENOMEM;
    /* the speculating jobs' trees are verified in the step's one forward:
     * logits rows for draft_max_batch trees of the default size (a request
     * asking for a bigger tree speculates when the rows are free) */
    s->spec_rows_cap = s->draft_max_batch * (1 + d.n_draft);
    cairn_log(CAIRN_LOG_INFO, "service: speculative decoding with %s: depth %d, top-k %d, at "
              "most %d draft tokens; speculates while at most %d requests decode",
              cairn_spec_describe(s->spec), d.depth, d.top_k, d.n_draft, s->draft_max_batch);
    return CAIRN_OK;
}

/* The tiered cache under the model's (and head's) page namespace. */
/* The store's page watcher, on the engine thread (tiers 0 and 1) and the
 * disk's I/O thread (tier 2): each event goes to the publisher's queue,
 * which is thread-safe and never blocks. */
static void kv_watch(const cairn_kv_page_event *e, void *user)
{
    cairn_kv_events *ev = user;
    if (e->kind == CAIRN_KV_PAGES_CLEARED) {
        cairn_kv_events_cleared(ev);
        return;
    }
    if (e->ns != 0 || e->tier < 0 || e->tier >= CAIRN_KV_MEDIUM_COUNT)
        return; /* only namespace 0 is published (store/announce.c says why) */
    /* the tiers are the media, fastest first: device GPU, host CPU, disk STORAGE */
    cairn_kv_medium m = (cairn_kv_medium)e->tier;
    if (e->kind == CAIRN_KV_PAGES_STORED)
        cairn_kv_events_stored(ev, m, e->has_parent, e->parent, e->hashes, e->n, e->tokens);
    else
        cairn_kv_events_removed(ev, m, e->hashes, e->n);
}

/* Bind the publisher, hook it to the store, and announce what the cache
 * already holds: after a restart, what LMDB kept, so the routers send this
 * replica the prefixes it still has. */
static int setup_kv_events(cairn_service *s, char *err, size_t err_len)
{
    const cairn_service_config *c = &s->cfg;
    cairn_kv_events_config ec = {.endpoint = c->kv_events, .replay_endpoint = c->kv_events_replay,
                                 .topic = c->kv_events_topic, .block_size = c->page_size,
                                 .data_parallel_rank = -1};
    int rc = cairn_kv_events_open(&ec, &s->kv_events, err, err_len);
    if (rc)
        return rc;
    if ((rc = cairn_kvcache_watch(s->cache, kv_watch, s->kv_events)) ||
        (rc = cairn_kvcache_announce_all(s->cache))) {
        snprintf(err, err_len, "KV events: announcing the cache failed: %s", cairn_strerror(rc));
        return rc;
    }
    cairn_kv_events_stats st;
    cairn_kv_events_get_stats(s->kv_events, &st);
    cairn_log(CAIRN_LOG_INFO, "service: KV events on %s%s%s (%llu announced at start)",
              c->kv_events, c->kv_events_replay ? ", replay on " : "",
              c->kv_events_replay ? c->kv_events_replay : "",
              (unsigned long long)st.queued_events);
    return CAIRN_OK;
}

static int setup_cache(cairn_service *s, char *err, size_t err_len)
{
    cairn_service_config *c = &s->cfg;
    size_t dev_free = 0, dev_total = 0;
    const bool device_memory = cairn_runtime_device_memory(s->rt, &dev_free, &dev_total) == CAIRN_OK;
    if (c->kv_bytes == 0 && device_memory) {
        /* A device: the KV pool is what the cache is for, so it takes most
         * of what the weights left, keeping a tenth of the device (at least
         * 1 GiB) for activations, cuBLAS workspaces and the runtime. */
        size_t keep = dev_total / 10 > ((size_t)1 << 30) ? dev_total / 10 : (size_t)1 << 30;
        c->kv_bytes = dev_free > keep + s->kv.page_bytes ? (dev_free - keep) / 10 * 9 : 0;
        if (c->kv_bytes < s->kv.page_bytes) {
            snprintf(err, err_len,
                     "the device has %.0f MiB free after the weights, too little for a KV cache; "
                     "set --kv-mem",
                     (double)dev_free / (1 << 20));
            return CAIRN_ENOMEM;
        }
    } else if (c->kv_bytes == 0) {
        /* the CPU: room for max_seqs full contexts, at most 1 GiB (host RAM
         * is everybody's) */
        c->kv_bytes = (size_t)c->max_seqs * ((size_t)s->n_ctx / c->page_size + 1) * s->kv.page_bytes;
        if (c->kv_bytes > ((size_t)1 << 30))
            c->kv_bytes = (size_t)1 << 30;
    }
    if (device_memory && c->host_bytes == 0) {
        /* Tier 1 of a device: page-locked host RAM that evicted pages move to
         * on the copy engine, an eighth of the machine's RAM, at most 8 GiB. */
        long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGE_SIZE);
        size_t ram = pages > 0 && psize > 0 ? (size_t)pages * (size_t)psize : 0;
        c->host_bytes = ram / 8 < ((size_t)8 << 30) ? ram / 8 : (size_t)8 << 30;
    }
    uint8_t fp[32]; /* the model's, then the methods': a page holds their KV too */
    cairn_model_fingerprint(s->model, fp);
    const bool method_kv = s->spec && cairn_spec_has_kv(s->spec);
    if (method_kv)
        cairn_spec_fingerprint(s->spec, fp + 16);
    cairn_page_namespace ns = {.model_fingerprint = fp, .fingerprint_bytes = method_kv ? 32 : 16,
                               .layout = &s->kv, .layout_version = CAIRN_KV_LAYOUT_VERSION};
    if (c->cache_dir && c->host_bytes == 0)
        c->host_bytes = (size_t)256 << 20; /* disk reads land in host RAM */
    if (c->cache_dir && c->disk_bytes == 0)
        c->disk_bytes = (size_t)4 << 30;
    cairn_kvcache_config kc = {.backend = cairn_runtime_backend(s->rt), .layout = s->kv,
                               .device_bytes = c->kv_bytes, .host_bytes = c->host_bytes,
                               .disk_dir = c->cache_dir, .disk_map_bytes = c->disk_bytes,
                               .shared = c->shared, .share_policy = c->share_policy,
                               /* on unless asked: without it a crash loses
                                  every prefix not evicted yet (store.h) */
                               .write_behind = !c->no_write_behind,
                               .plain_lru = c->plain_lru};
    int rc;
    if ((rc = cairn_page_namespace_hash(&ns, &kc.ns)) ||
        (rc = cairn_kvcache_create(&kc, &s->cache, err, err_len)))
        return rc;
    s->have_disk = cairn_kvcache_has_disk(s->cache);
    if (c->kv_events && (rc = setup_kv_events(s, err, err_len)))
        return rc;
    pins_bounds(s);
    s->have_shared = cairn_kvcache_has_shared(s->cache);
    if (c->load_policy != CAIRN_LOAD_MEASURED) {
        /* Pinned rates: a recompute that takes ~forever (always load), or a
         * load that does (never load). */
        cairn_kvcache_rates r = {.compute_tokens_per_s = 1e-3, .h2d_bytes_per_s = 1e12,
                                 .disk_bytes_per_s = 1e12, .disk_latency_s = 0};
        if (c->load_policy == CAIRN_LOAD_NEVER)
            r = (cairn_kvcache_rates){.compute_tokens_per_s = 1e12, .h2d_bytes_per_s = 1e-3,
                                      .disk_bytes_per_s = 1e-3, .disk_latency_s = 1e6};
        cairn_kvcache_override_rates(s->cache, &r);
    }
    return CAIRN_OK;
}

/* Session table, run queues and the batch's buffers: every allocation a
 * step needs, made once. */
static int setup_tables(cairn_service *s)
{
    const size_t max_seqs = (size_t)s->cfg.max_seqs;
    s->n_buckets = 1024;
    s->buckets = calloc(s->n_buckets, sizeof *s->buckets);
    s->running = calloc(max_seqs, sizeof *s->running);
    s->fetching = calloc(max_seqs, sizeof *s->fetching);
    s->batch = calloc(max_seqs, sizeof *s->batch);
    s->batch_jobs = calloc(max_seqs, sizeof *s->batch_jobs);
    s->logits = malloc((max_seqs + (size_t)s->spec_rows_cap) * (size_t)s->n_vocab * sizeof(float));
    if (!s->buckets || !s->running || !s->fetching || !s->batch || !s->batch_jobs || !s->logits)
        return CAIRN_ENOMEM;
    return CAIRN_OK;
}

int cairn_service_start(const cairn_service_config *cfg, cairn_service **out, char *err,
                        size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!cfg || !out || !cfg->runtime)
        return failf(err, err_len, CAIRN_EINVAL, "missing configuration");
    cairn_service *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    s->cfg = *cfg;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->rt = cfg->runtime;
    s->model = cairn_runtime_model(s->rt);
    s->vocab = cairn_runtime_vocab(s->rt);
    s->turn_end = cairn_runtime_turn_end(s->rt, &s->n_turn_end);
    s->spec = cairn_runtime_spec(s->rt);
    int rc;
    if ((rc = settle_config(s, err, err_len)) || (rc = setup_layout(s, err, err_len)) ||
        (rc = setup_cache(s, err, err_len)) || (rc = setup_tables(s)))
        goto fail;
    s->vocab_id = records_vocab_id(s->vocab, s->n_vocab);
    if (s->have_disk) {
        records_load(s);
        if (s->n_responses)
            cairn_log(CAIRN_LOG_INFO, "service: %zu sessions restored from %s (%zu of them "
                      "stored responses)", s->n_sessions, s->cfg.cache_dir, s->n_responses);
        else if (s->n_sessions)
            cairn_log(CAIRN_LOG_INFO, "service: %zu sessions restored from %s", s->n_sessions,
                      s->cfg.cache_dir);
        if (s->resp_expired || s->resp_pushed_out)
            cairn_log(CAIRN_LOG_INFO, "service: %llu stored responses expired and %llu beyond "
                      "max_responses (%zu) dropped from %s", (unsigned long long)s->resp_expired,
                      (unsigned long long)s->resp_pushed_out, s->cfg.max_responses,
                      s->cfg.cache_dir);
        if (s->records_skipped)
            cairn_log(CAIRN_LOG_WARN, "service: %zu sessions in %s are kept but not loaded (written "
                      "under another model or a larger context)", s->records_skipped,
                      s->cfg.cache_dir);
    }
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    s->thread_started = true;
    const cairn_service_config *c = &s->cfg;
    char device[32];
    cairn_device_name(cairn_runtime_device(s->rt), device, sizeof device);
    cairn_log(CAIRN_LOG_INFO, "service: %s on %s, KV %zu pages of %d tokens (%.1f MiB), context %d, "
              "batch %d tokens / %d sequences, prefix cache %s; host tier %.1f MiB, disk tier %s",
              cairn_model_hparams(s->model)->name, device, (size_t)(c->kv_bytes / s->kv.page_bytes),
              c->page_size, (double)c->kv_bytes / (1 << 20), s->n_ctx, c->max_batch_tokens,
              c->max_seqs, s->prefix_cache ? "on" : "off", (double)c->host_bytes / (1 << 20),
              c->cache_dir ? c->cache_dir : "off");
    *out = s;
    return CAIRN_OK;
fail:
    failf(err, err_len, rc, cairn_strerror(rc));
    cairn_service_stop(s);
    return rc;
}

/* Graceful stop: every open session's record, then every page that is not
 * on disk yet; flush waits for both to be committed. */
static void write_back(cairn_service *s)
{
    size_t n_rec = records_write_all(s);
    int rc = cairn_kvcache_flush(s->cache);
    cairn_kvcache_stats ks;
    cairn_kvcache_get_stats(s->cache, &ks);
    cairn_log(rc == CAIRN_OK ? CAIRN_LOG_INFO : CAIRN_LOG_ERROR,
              "service: %s: %zu session records, %llu pages on disk",
              rc == CAIRN_OK ? "written back" : "write-back failed", n_rec,
              (unsigned long long)ks.tier[CAIRN_TIER_DISK].pages);
}

void cairn_service_stop(cairn_service *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started)
        pthread_join(s->thread, NULL);
    if (s->thread_started && s->have_disk)
        write_back(s);
    for (size_t i = 0; i < s->inbox_n; i++)
        cairn_request_free(s->inbox[i]);
    free(s->inbox);
    if (s->cache)
        svc_log_cache_account(s); /* the run's account per tier, as cache.stats reports it */
    if (s->resp_expired || s->resp_pushed_out)
        cairn_log(CAIRN_LOG_INFO, "service: %llu stored responses expired, %llu pushed out by "
                  "newer ones (max_responses %zu) since start", (unsigned long long)s->resp_expired,
                  (unsigned long long)s->resp_pushed_out, s->cfg.max_responses);
    if (s->buckets) {
        for (size_t b = 0; b < s->n_buckets; b++)
            while (s->buckets[b])
                session_destroy(s, s->buckets[b]);
        free(s->buckets);
    }
    free(s->running);
    free(s->fetching);
    free(s->batch);
    free(s->batch_jobs);
    free(s->logits);
    sched_sampling_free(s);
    pins_free(s);
    cairn_kvcache_free(s->cache); /* stops the disk's I/O thread, the last watcher */
    cairn_kv_events_close(s->kv_events);
    if (s->spec)
        cairn_log(CAIRN_LOG_INFO, "service: %llu speculative steps gave %llu tokens (%.2f per "
                  "target forward)", (unsigned long long)s->spec_steps,
                  (unsigned long long)s->spec_tokens,
                  s->spec_steps ? (double)s->spec_tokens / (double)s->spec_steps : 0.0);
    free(s->features);
    free(s->spec_jobs);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int cairn_service_submit(cairn_service *s, cairn_request *req)
{
    if (!s || !req) {
        cairn_request_free(req);
        return CAIRN_EINVAL;
    }
    req->submitted_at = cairn_now();
    pthread_mutex_lock(&s->mu);
    int rc = CAIRN_OK;
    if (s->stopping) {
        rc = CAIRN_ECLOSED;
    } else if (s->inbox_n == s->inbox_cap) {
        size_t cap = s->inbox_cap ? s->inbox_cap * 2 : 64;
        cairn_request **in = realloc(s->inbox, cap * sizeof *in);
        if (in) {
            s->inbox = in;
            s->inbox_cap = cap;
        } else {
            rc = CAIRN_ENOMEM;
        }
    }
    if (rc == CAIRN_OK) {
        s->inbox[s->inbox_n++] = req;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc != CAIRN_OK)
        cairn_request_free(req);
    return rc;
}

const cairn_vocab *cairn_service_vocab(const cairn_service *s) { return s->vocab; }
const cairn_chat_template *cairn_service_chat_template(const cairn_service *s)
{
    return cairn_runtime_chat_template(s->rt);
}
cairn_runtime *cairn_service_runtime(const cairn_service *s) { return s->rt; }
const cairn_hparams *cairn_service_hparams(const cairn_service *s) { return cairn_model_hparams(s->model); }
int cairn_service_page_size(const cairn_service *s) { return s->page_size; }
const char *cairn_service_kv_type(const cairn_service *s) { return cairn_kv_type_name(s->kv.dtype); }
int cairn_service_n_ctx(const cairn_service *s) { return s->n_ctx; }

void cairn_service_tier_bytes(const cairn_service *s, size_t *kv, size_t *host, size_t *disk)
{
    *kv = s->cfg.kv_bytes;
    *host = s->cfg.host_bytes;
    *disk = s->cfg.cache_dir ? s->cfg.disk_bytes : 0;
}

int cairn_service_announce(cairn_service *s, const char *replica, const char *http,
                           const char *rpc)
{
    return s ? cairn_kvcache_announce(s->cache, replica, http, rpc) : CAIRN_EINVAL;
}
