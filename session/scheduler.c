/*
 * session/scheduler.c — which jobs run, and one step of them: admission
 * through the cache's prefix fetch, fairness between connections,
 * continuous batching (decoders first, prompts in chunks), speculative
 * steps while few requests decode, and pausing when KV pages run out.
 */
#include "session/session_impl.h"

#include <math.h>

void waiting_push(cairn_service *s, job *j, bool front)
{
    j->next = NULL;
    if (!s->waiting_head) {
        s->waiting_head = s->waiting_tail = j;
    } else if (front) {
        j->next = s->waiting_head;
        s->waiting_head = j;
    } else {
        s->waiting_tail->next = j;
        s->waiting_tail = j;
    }
    s->n_waiting++;
}

job *waiting_pop(cairn_service *s)
{
    job *j = s->waiting_head;
    if (j) {
        s->waiting_head = j->next;
        if (!s->waiting_head)
            s->waiting_tail = NULL;
        s->n_waiting--;
    }
    return j;
}


/* Find a running or waiting job of `client` with msgid `id`. */
job *sched_find_job(cairn_service *s, uint64_t client, uint64_t id)
{
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->req->client == client && s->running[i]->req->id == id)
            return s->running[i];
    for (job *j = s->waiting_head; j; j = j->next)
        if (j->req->client == client && j->req->id == id)
            return j;
    for (int i = 0; i < s->n_fetching; i++)
        if (s->fetching[i]->req->client == client && s->fetching[i]->req->id == id)
            return s->fetching[i];
    return NULL;
}


static void running_remove(cairn_service *s, int i)
{
    memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
}

/* Remove j from the running set (it must be there). */
static void running_drop(cairn_service *s, job *j)
{
    for (int k = 0; k < s->n_running; k++)
        if (s->running[k] == j) {
            running_remove(s, k);
            return;
        }
}

/* Finish cancelled jobs wherever they are. A gone client's jobs finish too;
 * the protocol drops events for connections that no longer exist. */
void sched_reap_cancelled(cairn_service *s)
{
    for (int i = 0; i < s->n_running;) {
        job *j = s->running[i];
        if (j->cancelled) {
            running_remove(s, i);
            j->finish = "cancelled";
            job_finish(s, j, true);
        } else {
            i++;
        }
    }
    job **pp = &s->waiting_head;
    s->waiting_tail = NULL;
    while (*pp) {
        job *j = *pp;
        if (j->cancelled) {
            *pp = j->next;
            s->n_waiting--;
            j->finish = "cancelled";
            job_finish(s, j, true);
        } else {
            s->waiting_tail = j;
            pp = &j->next;
        }
    }
}

/* Start running a job whose cached prefix (if any) is known: `ev` is its
 * fetch event, or NULL when nothing was looked up. */
static void job_adopt(cairn_service *s, job *j, const cairn_kvcache_event *ev)
{
    j->n_computed = 0;
    j->n_tree_pages = j->n_pages = 0;
    j->hold = ev ? ev->node : NULL;
    size_t resident = ev ? ev->resident_pages : 0;
    /* --shared-write all: its pages go to Redis as they are computed, so a
     * replica that finds it computing them waits for them (prefix.c) */
    j->share_wanted = j->share_wanted || (ev && ev->share_wanted) ||
                      (s->cfg.shared && s->cfg.share_policy == CAIRN_SHARE_ALL);
    if (resident > 0) {
        if (job_reserve_pages(j, resident) != CAIRN_OK ||
            cairn_kvcache_held_pages(s->cache, j->hold, resident, j->pages) != CAIRN_OK)
            resident = 0; /* cannot use it: compute everything */
        j->n_tree_pages = j->n_pages = resident;
        j->n_computed = resident * (size_t)s->page_size;
    }
    int partial_tier = CAIRN_TIER_DEVICE;
    size_t partial = prefix_take_partial(s, j, &partial_tier);
    if (j->spec) {
        /* head rows of the matched pages are valid (model.h); pages[] must
         * exist even when empty, capacity is set before every use */
        if (job_reserve_pages(j, 1) != CAIRN_OK ||
            cairn_spec_seq_adopt(j->spec, cairn_kvcache_kv_base(s->cache), &s->kv, j->pages,
                                  (int)(j->n_pages * (size_t)s->page_size), j->seq.v,
                                  (int)j->seq.n, (int)j->n_computed) != CAIRN_OK)
            j->spec_failed = true;
        j->spec_ready = false;
    }
    if (!j->admitted_once) {
        j->admitted_once = true;
        j->t_admitted = cairn_now();
        j->cached_tokens = (int64_t)j->n_computed;
        for (int t = 0; t < 3 && ev && resident > 0; t++)
            j->cached_by_tier[t] = (int64_t)ev->from_tier[t] * s->page_size;
        if (ev && resident > 0) { /* the disk tier's hits that Redis served */
            int64_t shared = (int64_t)ev->shared_pages * s->page_size;
            if (shared > j->cached_by_tier[2])
                shared = j->cached_by_tier[2];
            j->cached_by_tier[2] -= shared;
            j->cached_by_tier[3] = shared;
        }
        j->cached_by_tier[partial_tier] += (int64_t)partial; /* the reused rows of a page */
        for (int t = 0; t < 4; t++)
            s->stats.cached_tokens_by_tier[t] += (uint64_t)j->cached_by_tier[t];
        s->stats.queries++;
        s->stats.prompt_tokens += j->n_prompt;
        s->stats.cached_tokens += j->n_computed;
        svc_explain(s, j->req->tenant, j->seq.v, j->n_prompt, j->cached_tokens, j->shared_wait,
                    &j->miss);
    }
    s->running[s->n_running++] = j;
}

/* Jobs of `client` running or fetching now. */
static int client_load(const cairn_service *s, uint64_t client)
{
    int n = 0;
    for (int i = 0; i < s->n_running; i++)
        n += s->running[i]->req->client == client;
    for (int i = 0; i < s->n_fetching; i++)
        n += s->fetching[i]->req->client == client;
    return n;
}

/* Waiting jobs looked at per pick: bounds the cost of a long queue. */
#define PICK_LOOKAHEAD 256

/* Unlink j (prev: the job before it, NULL for the head) from the queue. */
static job *waiting_unlink(cairn_service *s, job *prev, job *j)
{
    if (!prev)
        return waiting_pop(s);
    prev->next = j->next;
    if (s->waiting_tail == j)
        s->waiting_tail = prev;
    s->n_waiting--;
    j->next = NULL;
    return j;
}

/* The next waiting job to admit, or NULL. First come, first served —
 * except that
 *   - a job whose prompt shares a prefix with one still computing it waits
 *     (prefix.c): it is passed over, keeping its place;
 *   - a connection already holding its fair share of the running slots
 *     (max_seqs divided among the connections that have work) is passed
 *     over while another connection waits, so one client with hundreds of
 *     queued requests cannot starve the rest. Work-conserving: with no one
 *     else to admit, its first job goes in anyway.
 * Removes the job from the queue. */
static job *waiting_pick(cairn_service *s)
{
    /* connections with work: a bounded count is enough for the share */
    uint64_t seen[64];
    int n_seen = 0;
    for (int i = 0; i < s->n_running + s->n_fetching && n_seen < 64; i++) {
        const job *j = i < s->n_running ? s->running[i] : s->fetching[i - s->n_running];
        bool dup = false;
        for (int k = 0; k < n_seen && !dup; k++)
            dup = seen[k] == j->req->client;
        if (!dup)
            seen[n_seen++] = j->req->client;
    }
    for (const job *j = s->waiting_head; j && n_seen < 64; j = j->next) {
        bool dup = false;
        for (int k = 0; k < n_seen && !dup; k++)
            dup = seen[k] == j->req->client;
        if (!dup)
            seen[n_seen++] = j->req->client;
    }
    const int share = n_seen ? (s->cfg.max_seqs + n_seen - 1) / n_seen : s->cfg.max_seqs;
    job *prev = NULL, *first = NULL, *first_prev = NULL;
    int looked = 0; /* a bounded look: the rest move up as these go in */
    const double now = cairn_now();
    for (job *j = s->waiting_head; j && looked < PICK_LOOKAHEAD; prev = j, j = j->next, looked++) {
        if (j->cancelled) /* reaped next; admitting it is harmless and quick */
            return waiting_unlink(s, prev, j);
        if (j->remote_retry_at > now) /* waits for another replica's pages */
            continue;
        if (prefix_should_wait(s, j)) {
            if (!j->shared_wait) {
                j->shared_wait = true;
                s->stats.shared_waits++;
            }
            continue;
        }
        if (!first) {
            first = j;
            first_prev = prev;
        }
        if (client_load(s, j->req->client) < share)
            return waiting_unlink(s, prev, j);
    }
    return first ? waiting_unlink(s, first_prev, first) : NULL;
}

double sched_ready_at(const cairn_service *s)
{
    if (!s->waiting_head)
        return INFINITY;
    const double now = cairn_now();
    double at = INFINITY;
    int looked = 0;
    const job *j = s->waiting_head;
    for (; j && looked < PICK_LOOKAHEAD; j = j->next, looked++) {
        if (j->remote_retry_at <= now)
            return 0;
        if (j->remote_retry_at < at)
            at = j->remote_retry_at;
    }
    return j ? 0 : at; /* past the look-ahead: admission looks again */
}

void sched_admit(cairn_service *s)
{
    /* After a pause, admitting more would only lock more pages and pause
     * again: wait until a running job finishes (or nothing runs). */
    if (s->pages_tight && s->n_running > 0)
        return;
    s->pages_tight = false;
    while (s->n_running + s->n_fetching < s->cfg.max_seqs && s->waiting_head) {
        job *j = waiting_pick(s);
        if (!j)
            break; /* all wait for prefixes being computed */
        if (s->prefix_cache && j->seq.n >= 2) {
            j->cookie = ++s->next_cookie;
            /* leave the last token out: it must be computed for its logits */
            if (cairn_kvcache_fetch(s->cache, j->req->tenant, j->seq.v, j->seq.n - 1,
                                    SIZE_MAX, j->cookie) == CAIRN_OK) {
                s->fetching[s->n_fetching++] = j;
                continue;
            }
        }
        job_adopt(s, j, NULL);
    }
}


/* Take what the cache has finished: fetched prefixes start running;
 * durability completions release replies. */
void sched_poll_cache(cairn_service *s)
{
    cairn_kvcache_event ev[16];
    int n = 0;
    /* The publisher dropped events (its queue was full): the routers' view
     * is wrong until everything is announced again, from a clean slate. */
    if (s->kv_events && cairn_kv_events_take_overflow(s->kv_events)) {
        cairn_kvcache_announce_all(s->cache);
        s->kv_resyncs++;
    }
    while (cairn_kvcache_poll(s->cache, ev, 16, &n) == CAIRN_OK && n > 0) {
        for (int i = 0; i < n; i++) {
            switch (ev[i].kind) {
            case CAIRN_KVCACHE_EV_FETCH:
                for (int k = 0; k < s->n_fetching; k++) {
                    job *j = s->fetching[k];
                    if (j->cookie != ev[i].cookie)
                        continue;
                    s->fetching[k] = s->fetching[--s->n_fetching];
                    if (!prefix_wait_remote(s, j, &ev[i]))
                        job_adopt(s, j, &ev[i]); /* cancelled ones are reaped next */
                    break;
                }
                break;
            case CAIRN_KVCACHE_EV_PERSIST:
            case CAIRN_KVCACHE_EV_RECORD_PUT:
            case CAIRN_KVCACHE_EV_RECORD_DELETE:
                intake_durable_done(s, ev[i].cookie, ev[i].status);
                break;
            case CAIRN_KVCACHE_EV_RECORD_GET:
                records_lookup_done(s, ev[i].cookie, ev[i].status, ev[i].data, ev[i].data_bytes);
                break;
            default:
                break;
            }
        }
    }
}

/* Pause a running job: its computed pages go to the tree (unlocked, so they
 * can be evicted now), and it waits at the front of the queue. */
static void pause_one(cairn_service *s, job *j)
{
    s->pages_tight = true;
    running_drop(s, j);
    job_release_pages(s, j);
    waiting_push(s, j, true);
    s->stats.paused++;
}


/* The speculating jobs' trees join this step's batch: entries n .. n +
 * n_spec - 1 of s->batch. A job whose drafting fails fails (its pages may
 * lack method KV). Returns how many entries were added (jobs that failed
 * leave spec_jobs). */
static int draft_speculative(cairn_service *s, int n, int n_spec)
{
    int k = 0;
    for (int i = 0; i < n_spec; i++) {
        job *j = s->spec_jobs[i];
        int rc = cairn_spec_seq_set_pages(j->spec, j->pages, job_capacity(s, j));
        cairn_spec_seq_set_outlook(j->spec, true, j->req->gen.max_tokens - j->n_gen);
        if (rc == CAIRN_OK)
            rc = cairn_spec_seq_draft(j->spec, SPEC_OUT_MAX, &s->batch[n + k]);
        if (rc != CAIRN_OK) {
            running_drop(s, j);
            job_fail_head(s, j);
            continue;
        }
        s->batch_jobs[n + k] = j;
        s->spec_jobs[k++] = j;
    }
    return k;
}

/* A speculating job's tree was verified in the batch: its logits rows
 * (the filter may change them) and features rows. */
static void finish_speculative(cairn_service *s, job *j, float *logits, const float *features)
{
    int32_t out[SPEC_OUT_MAX];
    int n_out = 0;
    int rc = cairn_spec_seq_verified(j->spec, logits, features, out, &n_out);
    if (rc == CAIRN_OK && n_out == 0) {
        /* the grammar allowed no token: as job_take_token, the end */
        running_drop(s, j);
        j->finish = "stop";
        const size_t n_past = (size_t)cairn_spec_seq_n_past(j->spec);
        j->n_computed = n_past < j->seq.n ? n_past : j->seq.n;
        job_finish(s, j, true);
        return;
    }
    if (rc != CAIRN_OK) {
        running_drop(s, j);
        job_fail_head(s, j);
        return;
    }
    s->spec_steps++;
    s->spec_tokens += (uint64_t)n_out;
    j->spec_forwards++;
    j->spec_tokens += n_out;
    job_note_tokens_time(s, j, n_out);
    bool done = false;
    const cairn_token_logprob *lps = j->req->gen.logprobs ? cairn_spec_seq_logprobs(j->spec)
                                                          : NULL;
    const size_t per = 1 + (size_t)j->req->gen.sampling.n_logprobs;
    for (int t = 0; t < n_out && !done; t++)
        done = job_push_token(s, j, out[t], lps ? lps + (size_t)t * per : NULL, true);
    /* the walk ended with the token that completed the grammar: the last
     * pushed, so the whole answer is kept (the matcher saw them all) */
    if (!done && j->matcher && cairn_grammar_matcher_done(j->matcher)) {
        j->finish = "stop";
        done = true;
    }
    /* the accepted tokens' KV is in the pages (the last one is pending);
     * tokens cut by a stop keep theirs, which is the same KV */
    size_t n_past = (size_t)cairn_spec_seq_n_past(j->spec);
    j->n_computed = n_past < j->seq.n ? n_past : j->seq.n;
    if (done) {
        running_drop(s, j);
        job_finish(s, j, true);
    } else {
        prefix_extend(s, j);
    }
}

/* Whether j decodes by a speculative step this time (its tree pages taken);
 * when the pages cannot be had, or its measured speed says speculation does
 * not pay now, it decodes plainly. */
static bool plan_speculative(cairn_service *s, job *j)
{
    if (!(j->spec_ok && j->spec_ready &&
          (size_t)cairn_spec_seq_n_past(j->spec) == j->n_computed))
        return false;
    if (s->spec_rows_left < j->spec_rows || !cairn_spec_seq_wants_step(j->spec))
        return false;
    size_t span = j->n_computed + (size_t)j->spec_span;
    if (span > (size_t)s->n_ctx)
        span = (size_t)s->n_ctx;
    if (job_ensure_pages(s, j, span) != CAIRN_OK)
        return false;
    s->spec_rows_left -= j->spec_rows;
    return true;
}

/* Pages for the next `chunk` tokens of running[i], pausing the newest other
 * jobs, or this one, when they run out. Returns
 *   1   planned: it joins the batch
 *   0   not this step (paused, or waiting for fetching jobs to join)
 *  -1   it failed (the error is emitted)
 * and *removed says whether it left the running set (then the caller's
 * index already names the next job). */
static int plan_pages(cairn_service *s, int i, size_t chunk, bool *removed)
{
    job *j = s->running[i];
    *removed = false;
    int rc;
    while ((rc = job_ensure_pages(s, j, j->n_computed + chunk)) == CAIRN_EFULL &&
           s->n_running - 1 > i)
        pause_one(s, s->running[s->n_running - 1]);
    if (rc == CAIRN_OK)
        return 1;
    if (rc == CAIRN_EFULL && s->n_fetching > 0) {
        /* Jobs still fetching hold locks on their prefixes; they join the
         * running set (as its newest) next step and can be paused then. */
        return 0;
    }
    *removed = true;
    running_remove(s, i);
    if (rc == CAIRN_EFULL && i > 0) {
        /* j is the newest: it waits for the older ones to finish */
        job_release_pages(s, j);
        waiting_push(s, j, true);
        s->stats.paused++;
        s->pages_tight = true;
        return 0;
    }
    job_fail(s, j, rc == CAIRN_EFULL ? CAIRN_EFULL : rc,
             rc == CAIRN_EFULL ? "not enough KV cache for this request"
                               : "cannot allocate KV pages");
    return -1;
}

/* Build this step's batch, oldest job first: each decoder gets one token,
 * prompts share what is left of the batch in chunks; jobs that speculate go
 * to spec_jobs. When pages run out, the newest job not yet planned is paused
 * (pause_one); when the job being planned is itself the newest it pauses,
 * unless it is alone — then it cannot fit at all and fails. Returns the
 * batch's sequences; *n_spec the speculating jobs. */
static int plan_batch(cairn_service *s, int *n_spec)
{
    int n_dec = 0;
    for (int i = 0; i < s->n_running; i++)
        n_dec += s->running[i]->seq.n - s->running[i]->n_computed == 1;
    int prefill_budget = s->cfg.max_batch_tokens - n_dec;
    int n = 0;
    *n_spec = 0;
    /* speculating jobs' trees are verified in the same forward: their rows
     * come out of the batch and out of the logits rows kept for them */
    s->spec_rows_left = s->spec_rows_cap;
    /* few decoders: those that may speculate do, each in its own forward */
    const bool speculate = s->spec && s->draft_max_batch > 0 && n_dec <= s->draft_max_batch;
    for (int i = 0; i < s->n_running;) {
        job *j = s->running[i];
        size_t remaining = j->seq.n - j->n_computed;
        size_t chunk = 1;
        if (j->spec_failed) {
            running_remove(s, i);
            job_fail_head(s, j);
            continue;
        }
        if (speculate && remaining == 1 && prefill_budget >= j->spec_rows - 1 &&
            plan_speculative(s, j)) {
            s->spec_jobs[(*n_spec)++] = j;
            prefill_budget -= j->spec_rows - 1; /* it was counted as one decoder */
            i++;
            continue;
        }
        if (remaining > 1) {
            chunk = remaining < (size_t)s->cfg.prefill_chunk ? remaining
                                                             : (size_t)s->cfg.prefill_chunk;
            if (chunk > (size_t)prefill_budget)
                chunk = (size_t)prefill_budget;
            if (chunk == 0) { /* no room left in this step's batch */
                i++;
                continue;
            }
        }
        bool removed;
        int planned = plan_pages(s, i, chunk, &removed);
        if (planned <= 0) {
            if (!removed)
                i++;
            continue;
        }
        s->batch[n] = (cairn_seq_batch){
            .tokens = j->seq.v + j->n_computed,
            .n_tokens = (int)chunk,
            .kv_start = (int)j->n_computed,
            .pages = j->pages,
        };
        s->batch_jobs[n++] = j;
        if (remaining > 1)
            prefill_budget -= (int)chunk;
        i++;
    }
    return n;
}

/* ---- sampling where the logits are ----------------------------------------
 * A step without speculative rows leaves its logits in backend memory
 * (cairn_model_forward_keep) and samples the rows of finished prompts with
 * cairn_sample_batch_run: on a device with the sample_rows slot only token
 * ids (and asked-for logprobs) come back; elsewhere each row is downloaded
 * and sampled on the host, exactly as job_take_token would. Grammar jobs
 * hand over their matcher's mask as bits. Speculative steps keep the host
 * rows the verifier reads. */
struct sched_sampling {
    cairn_sample_batch *batch;
    cairn_sample_req *reqs;    /* [max_seqs]                                   */
    int32_t *tokens;           /* [max_seqs]                                   */
    int *status;               /* [max_seqs]                                   */
    cairn_token_logprob *lp;   /* [max_seqs][1 + CAIRN_SAMPLE_MAX_LOGPROBS]    */
    uint32_t *bits;            /* [max_seqs][words] grammar masks              */
    float *scratch;            /* [n_vocab] the row a matcher masks            */
    int *req_of;               /* [max_seqs] batch entry -> request, or one of: */
    bool broken;               /* setting up failed: the host path for good    */
};
enum { NOT_SAMPLED = -1, MASKED_OUT = -2 };

void sched_sampling_free(cairn_service *s)
{
    struct sched_sampling *x = s->sampling;
    if (!x)
        return;
    cairn_sample_batch_free(x->batch);
    free(x->reqs);
    free(x->tokens);
    free(x->status);
    free(x->lp);
    free(x->bits);
    free(x->scratch);
    free(x->req_of);
    free(x);
    s->sampling = NULL;
}

/* The sampling state, made on first use; NULL when it cannot be (the step
 * then takes the host path). */
static struct sched_sampling *sampling_ready(cairn_service *s)
{
    if (s->sampling)
        return s->sampling->broken ? NULL : s->sampling;
    struct sched_sampling *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    s->sampling = x;
    const size_t n = (size_t)s->cfg.max_seqs, words = ((size_t)s->n_vocab + 31) / 32;
    x->reqs = calloc(n, sizeof *x->reqs);
    x->tokens = calloc(n, sizeof *x->tokens);
    x->status = calloc(n, sizeof *x->status);
    x->lp = calloc(n * (1 + CAIRN_SAMPLE_MAX_LOGPROBS), sizeof *x->lp);
    x->bits = calloc(n * words, sizeof *x->bits);
    x->scratch = calloc((size_t)s->n_vocab, sizeof *x->scratch);
    x->req_of = calloc(n, sizeof *x->req_of);
    if (!x->reqs || !x->tokens || !x->status || !x->lp || !x->bits || !x->scratch || !x->req_of ||
        cairn_sample_batch_create(cairn_model_backend(s->model), s->n_vocab, (int)n, &x->batch) !=
            CAIRN_OK) {
        x->broken = true;
        return NULL;
    }
    return x;
}

/* Draw the tokens of the plain batch entries whose prompt this step
 * finishes from the kept logits (row b for entry b). x->req_of[b] says
 * what became of entry b. */
static int sample_kept(cairn_service *s, struct sched_sampling *x, int n, const float *kept)
{
    const size_t words = ((size_t)s->n_vocab + 31) / 32;
    int n_req = 0;
    for (int b = 0; b < n; b++) {
        job *j = s->batch_jobs[b];
        x->req_of[b] = NOT_SAMPLED;
        if (j->n_computed + (size_t)s->batch[b].n_tokens < j->seq.n)
            continue; /* the prompt goes on: its row is not wanted */
        uint32_t *bits = x->bits + (size_t)n_req * words;
        if (j->matcher && !job_grammar_bits(s, j, x->scratch, bits)) {
            x->req_of[b] = MASKED_OUT;
            continue;
        }
        x->reqs[n_req] = (cairn_sample_req){.row = b, .sampler = j->sampler,
                                            .allowed = j->matcher ? bits : NULL,
                                            .want_logprobs = j->req->gen.logprobs};
        x->req_of[b] = n_req++;
    }
    if (n_req == 0)
        return CAIRN_OK;
    return cairn_sample_batch_run(x->batch, kept, n_req, x->reqs, x->tokens, x->status, x->lp);
}

/* The forward pass over the planned batch; feeds the cache the measured
 * prefill rate. kept: NULL, or where the logits left in backend memory go
 * (cairn_model_forward_keep) instead of s->logits. */
static int run_forward(cairn_service *s, int n, const float **kept)
{
    int n_out = 0, n_tokens = 0;
    for (int b = 0; b < n; b++)
        n_tokens += s->batch[b].n_tokens;
    double t0 = cairn_now();
    void *kv = cairn_kvcache_kv_base(s->cache);
    /* with a method that reads features, every token's: it runs over all */
    int rc = kept ? cairn_model_forward_keep(s->model, kv, &s->kv, s->batch, n, s->features, kept,
                                             &n_out)
             : s->features ? cairn_model_forward_features(s->model, kv, &s->kv, s->batch, n,
                                                          s->logits, s->features, &n_out)
                           : cairn_model_forward(s->model, kv, &s->kv, s->batch, n, s->logits,
                                                 NULL, &n_out);
    /* Steps with real prefill measure how fast tokens are computed; the
     * cache weighs that against load times to decide what to load. */
    double dt = cairn_now() - t0;
    s->forward_seconds = dt;
    if (rc == CAIRN_OK && n_tokens >= 32 && dt > 0) {
        double rate = n_tokens / dt;
        s->compute_rate = s->compute_rate > 0 ? 0.8 * s->compute_rate + 0.2 * rate : rate;
        cairn_kvcache_set_compute_rate(s->cache, s->compute_rate);
    }
    return rc;
}

/* A prompt that takes long to compute says how far it is in the log, at
 * most once a second (--progress-ms): a person who sent a 100k-token document sees the
 * server working and when it will answer, not a silent minute. Only log
 * lines (no TTY output): the server's stderr is usually a journal. The
 * rate counts the tokens this request computed since its admission, so a
 * cached prefix does not inflate it. */
static void log_prefill_progress(const cairn_service *s, job *j)
{
    if (s->cfg.progress_ms < 0)
        return;
    const double every = s->cfg.progress_ms / 1e3;
    const double now = cairn_now();
    const bool done = j->n_computed >= j->n_prompt;
    if (j->t_admitted <= 0 || (!j->t_progress && now - j->t_admitted < every))
        return; /* short prefills say nothing */
    if (!done && j->t_progress && now - j->t_progress < every)
        return;
    if (done && !j->t_progress)
        return; /* finished within a second of its last chunk: no line yet */
    const double dt = now - j->t_admitted;
    const size_t from = j->cached_tokens > 0 ? (size_t)j->cached_tokens : 0;
    const size_t computed = j->n_computed > from ? j->n_computed - from : 0;
    const double rate = dt > 0 ? (double)computed / dt : 0;
    const size_t n = j->n_prompt;
    if (done)
        cairn_log(CAIRN_LOG_INFO,
                  "prefill: client %llu request %llu: %zu tokens computed in %.1f s "
                  "(%.0f tok/s, %zu cached)",
                  (unsigned long long)j->req->client, (unsigned long long)j->req->id, computed,
                  dt, rate, from);
    else
        cairn_log(CAIRN_LOG_INFO,
                  "prefill: client %llu request %llu: %zu / %zu tokens (%.0f%%), %.0f tok/s, "
                  "ETA %.0f s",
                  (unsigned long long)j->req->client, (unsigned long long)j->req->id,
                  j->n_computed, n, 100.0 * (double)j->n_computed / (double)(n ? n : 1), rate,
                  rate > 0 ? (double)(n - j->n_computed) / rate : 0.0);
    j->t_progress = done ? 0 : now;
}

void sched_step(cairn_service *s)
{
    int n_spec = 0;
    const int n = plan_batch(s, &n_spec);
    n_spec = draft_speculative(s, n, n_spec);
    if (n + n_spec == 0)
        return;
    /* without speculative rows (whose verifier reads host rows) the logits
     * stay where they are computed and are sampled there */
    struct sched_sampling *x = n_spec == 0 ? sampling_ready(s) : NULL;
    const float *kept = NULL;
    int rc = run_forward(s, n + n_spec, x ? &kept : NULL);
    if (rc == CAIRN_OK && x)
        rc = sample_kept(s, x, n, kept);
    if (rc != CAIRN_OK) {
        for (int b = 0; b < n + n_spec; b++) {
            job *j = s->batch_jobs[b];
            running_drop(s, j);
            job_fail(s, j, rc, "the forward pass failed");
        }
        return;
    }
    /* every plain sequence in the batch returned its last row's logits
     * (needed only where the prompt is finished), every tree all its rows */
    const float *features = s->features;
    /* a feature row: the final state, or an EAGLE-3 head's layer states */
    const size_t dim = (size_t)cairn_model_feature_dim(s->model);
    size_t row = 0;
    for (int b = 0; b < n; b++) {
        job *j = s->batch_jobs[b];
        const int n_tok = s->batch[b].n_tokens;
        j->n_computed += (size_t)n_tok;
        if (n_tok > 1)
            log_prefill_progress(s, j);
        bool done;
        if (!x)
            done = j->n_computed >= j->seq.n && job_take_token(s, j, s->logits + row * s->n_vocab);
        else if (x->req_of[b] == MASKED_OUT)
            done = job_take_masked_out(s, j);
        else if (x->req_of[b] >= 0)
            done = job_take_sampled(s, j, x->tokens[x->req_of[b]], x->status[x->req_of[b]],
                                    x->lp + (size_t)x->req_of[b] * (1 + CAIRN_SAMPLE_MAX_LOGPROBS));
        else
            done = false;
        row++;
        /* the methods over the same tokens, now that the next one is known,
         * before the pages can go to the tree */
        const double t_advance = cairn_now();
        if (j->spec) /* will it speculate soon? every running job decodes soon */
            cairn_spec_seq_set_outlook(j->spec, j->spec_ok && s->n_running <= s->draft_max_batch,
                                       j->req->gen.max_tokens - j->n_gen);
        const int arc = j->spec ? job_spec_advance(s, j, features, n_tok) : CAIRN_OK;
        /* what a plain step costs this job, its methods' upkeep (a draft
         * model's forward) included: speculation must beat it */
        if (j->spec && n_tok == 1 && arc == CAIRN_OK)
            cairn_spec_seq_note_plain_cost(j->spec,
                                           s->forward_seconds + (cairn_now() - t_advance));
        if (arc != CAIRN_OK) {
            running_drop(s, j);
            job_fail_head(s, j);
        } else if (done) {
            running_drop(s, j);
            job_finish(s, j, true);
        } else {
            prefix_extend(s, j); /* requests waiting for these pages may go */
        }
        if (features)
            features += (size_t)n_tok * dim;
    }
    for (int b = n; b < n + n_spec; b++) {
        const int T = s->batch[b].n_tokens;
        finish_speculative(s, s->batch_jobs[b], s->logits + row * s->n_vocab, features);
        row += (size_t)T;
        if (features)
            features += (size_t)T * dim;
    }
}

void sched_cancel_client(cairn_service *s, uint64_t client)
{
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->req->client == client)
            s->running[i]->cancelled = true;
    for (job *j = s->waiting_head; j; j = j->next)
        if (j->req->client == client)
            j->cancelled = true;
    for (int i = 0; i < s->n_fetching; i++)
        if (s->fetching[i]->req->client == client)
            s->fetching[i]->cancelled = true;
}
