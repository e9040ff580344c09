/*
 * session/session_impl.h — the engine thread's own state, shared by the
 * files of session/ and nothing else (nothing outside session/ includes
 * this). session.h says what the service promises; this says how it keeps
 * the promise:
 *
 *   service.c    the thread, its inbox and its loop; start and stop
 *   intake.c     one request from the inbox: session calls, generations,
 *                cancels; replies that wait for durability
 *   sessions.c   session ids, the session table, named (keyed) sessions
 *   records.c    a session's durable record: format, write, read at start
 *   jobs.c       one generation: its pages, sampling, text, stop strings,
 *                deltas, finishing
 *   scheduler.c  which jobs run: admission (prefix fetch), fairness, the
 *                batched step, speculative steps, pausing for pages
 *   prefix.c     a prefix computed once: who waits for whom, pages to the
 *                tree while computing, reuse of part of a page
 *   events.c     what leaves the engine: events, latency histograms, stats
 *   pins.c       retention hints: prefixes kept cached until a deadline
 *
 * Life of a generation request ("job"):
 *
 *   submit ──▶ inbox ──▶ waiting (FIFO) ──admit──▶ running ──finish──▶ event
 *                           ▲      (fetching: the     │
 *                           │      cache brings its   │
 *                           │      prefix to tier 0)  │
 *                           └──────── pause ──────────┘  (pages ran out)
 *
 *   admit:  ask the cache for seq[0 .. n-1) (at least one token is always
 *           computed, for its logits); its event holds the matched prefix,
 *           whose device pages head the job's page table.
 *   step:   compute seq[n_computed .. n_computed+chunk) into pages the job
 *           allocated itself; when the chunk reaches the end of seq, sample
 *           one token and append it to seq.
 *   finish: commit the computed whole pages to the cache (the tree takes
 *           the new ones; duplicates are returned), release the hold, emit
 *           DONE.
 *   pause:  the same commit, then back to the front of `waiting` with its
 *           sequence (prompt + generated so far) and sampler intact; on
 *           re-admission its own pages are found again by prefix match.
 *
 * Everything here belongs to the engine thread, except the inbox and the
 * stopping flag (guarded by mu).
 */
#ifndef CAIRN_SESSION_IMPL_H
#define CAIRN_SESSION_IMPL_H

#include "session/session.h"

/* Tokens one speculative step may emit: cairn_spec_seq_max_out (a tree is at
 * most 16 deep, plus the token drawn after it). */
#define SPEC_OUT_MAX 17
#include "store/store.h"
#include "kvevents/kvevents.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- token arrays -------------------------------------------------------- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} tokvec;

static inline int tokvec_reserve(tokvec *t, size_t need)
{
    if (need <= t->cap)
        return CAIRN_OK;
    size_t cap = t->cap ? t->cap : 64;
    while (cap < need)
        cap *= 2;
    int32_t *v = realloc(t->v, cap * sizeof *v);
    if (!v)
        return CAIRN_ENOMEM;
    t->v = v;
    t->cap = cap;
    return CAIRN_OK;
}

static inline int tokvec_append(tokvec *t, const int32_t *src, size_t n)
{
    if (n == 0)
        return CAIRN_OK;
    int rc = tokvec_reserve(t, t->n + n);
    if (rc)
        return rc;
    memcpy(t->v + t->n, src, n * sizeof *src);
    t->n += n;
    return CAIRN_OK;
}

/* ---- sessions, jobs, deferred replies ------------------------------------ */

typedef struct session {
    cairn_session_id id;
    tokvec history;
    bool busy;       /* a generation is running on it                         */
    bool reply_open; /* the last thing added was a generated reply, without
                        the turn end its end-of-generation token would have
                        been (that token is never kept in the history)      */
    bool persist;    /* record and pages are made durable on every change    */
    cairn_kv_live live; /* its history's cached pages, marked live (sessions.c) */
    uint64_t tenant;
    char *key;       /* a named session (SESSION_SYNC): its name, else NULL   */
    size_t key_len;
    uint64_t last_used; /* named sessions: for the least recently used one   */
    char *note;      /* a front end's bytes (SESSION_NOTE), or NULL           */
    size_t note_len;
    /* A stored response (cairn_request.response; sessions.c): in the
     * service's list of them, least recently continued first. */
    bool response;
    int64_t created; /* responses: Unix time it was made                    */
    int64_t expires; /* responses: Unix time it expires, fixed when it was
                        made from the TTL then in force (0: never), so a
                        restart with another --responses-ttl does not
                        shorten the life it was given                   */
    struct session *resp_prev, *resp_next;
    struct session *next;
} session;

typedef struct svc_pin svc_pin; /* pins.c */

typedef struct job {
    cairn_request *req;
    svc_pin *pins[CAIRN_MAX_PINS]; /* req->pins[i]'s entry (pins.c), until the
                                      job commits or gives it up; NULL: none */
    session *sess;           /* session.generate: history to extend           */
    tokvec seq;              /* prompt followed by generated tokens           */
    size_t n_prompt;
    size_t n_computed;       /* tokens of seq whose KV is in pages            */
    bool admitted_once;
    bool shared_wait;        /* counted once in stats.shared_waits             */
    /* Waiting for another replica's pages (prefix.c, "remote"). */
    bool remote_wait;        /* counted once in stats.remote_waits             */
    bool remote_gave_up;     /* waited shared_wait_s for nothing: computes     */
    double remote_retry_at;  /* not admitted again before (cairn_now)          */
    double remote_progress_at; /* when its fetch last found more pages       */
    size_t remote_resident;  /* pages its last fetch found                     */
    int64_t cached_tokens;   /* reported: matched at the first admission      */
    cairn_cache_miss miss;   /* why the rest was not: at the first admission  */
    cairn_kv_hold *hold;     /* the cached prefix it started from (locked)    */
    size_t n_tree_pages;     /* pages[0 .. n_tree_pages) are the hold's        */
    int32_t *pages;          /* page table; the rest were allocated by the job */
    size_t n_pages, pages_cap;
    cairn_sampler *sampler;
    /* Structured output (gen.grammar): masks logits before each draw (also
     * at each node of a speculative step's walk). */
    cairn_grammar_matcher *matcher;
    /* With speculative methods: keeps their KV in the job's pages in step
     * with every forward (always), and decodes speculatively when spec_ok. */
    cairn_spec_seq *spec;
    const cairn_vocab *vocab; /* the service's, for the decoder's hooks        */
    bool spec_ok;
    bool spec_failed;        /* adopting the pages failed: the job fails       */
    int spec_span;           /* KV indices a speculative step may write        */
    int spec_rows;           /* rows its tree may take in a forward (1 + n)    */
    bool spec_ready;         /* the head has run over the pending token's
                                predecessor (not so right after admission:
                                that row is a page's last, see model.h)       */
    int64_t spec_forwards, spec_tokens; /* its speculative steps and their tokens */
    cairn_detok *detok;
    cairn_token_logprob *lps; /* gen.logprobs: [n_gen][1 + n_logprobs]       */
    size_t lps_cap;
    char *text;              /* generated text so far (stop strings cut off) */
    size_t text_len, text_cap, text_sent;
    size_t tokens_sent;      /* generated tokens already sent in deltas        */
    int n_gen;
    double t_admitted;       /* first admission (0: not yet)                  */
    double t_first_token;    /* first token sampled (0: not yet)              */
    double t_last_token;     /* when the previous token was sampled (0: none) */
    double t_progress;       /* a long prefill's last progress line (0: none)  */
    bool cancelled;
    const char *finish;      /* set when the job is done                      */
    int32_t eog_token;       /* the end-of-generation token that ended it, or -1 */
    int stop_string;         /* 1 + the index of the stop string that ended it */
    int64_t cached_by_tier[4]; /* device, host, disk (local LMDB), shared (Redis) */
    bool share_wanted;         /* another replica looked this prefix up too: give
                                  its pages to the shared tier as they come   */
    uint64_t cookie;         /* of its fetch, then of its durability writes    */
    int outstanding;         /* durability completions still to come           */
    bool durable_failed;
    struct job *next;        /* in `waiting`, or in `durable` (finished, waiting
                                for its session to be on disk before replying) */
} job;

/* A session call whose reply waits for its record to be durable. */
typedef struct deferred {
    uint64_t cookie;
    int outstanding;
    bool failed;
    cairn_request *req;
    cairn_session_id id;
    int64_t n_tokens;
    struct deferred *next;
} deferred;

/* A request naming a session this replica does not hold, waiting for that
 * session's record (records.c: from the disk tier or the shared tier). */
typedef struct lookup {
    uint64_t cookie;
    cairn_request *req;
    struct lookup *next;
} lookup;

struct cairn_service {
    cairn_service_config cfg;
    cairn_kv_events *kv_events; /* the page publisher (config.kv_events), or NULL */
    uint64_t kv_resyncs;        /* re-announcements after its queue overflowed */
    cairn_runtime *rt;         /* borrowed: backend, model, vocab, template */
    cairn_model *model;
    const cairn_vocab *vocab;
    const int32_t *turn_end;   /* the template's turn end, tokenized (the runtime's) */
    size_t n_turn_end;
    cairn_kvcache *cache;
    cairn_kv_layout kv;
    int n_ctx, n_vocab, page_size;
    uint64_t vocab_id;         /* records_vocab_id of this model: what a
                                  session record's tokens must be ids of   */
    size_t records_skipped;    /* sound records of another configuration
                                  (kept on disk, not loaded)               */
    bool prefix_cache;
    cairn_spec *spec;          /* the runtime's speculative methods, or NULL  */
    cairn_spec_params draft;
    int draft_max_batch;       /* speculate while at most this many decode; 0 never */
    float *features;           /* [max_batch_tokens][dim] when a method reads
                                  the target's features, else NULL            */
    job **spec_jobs;           /* this step's speculating jobs                */
    int spec_rows_cap;         /* logits rows kept for their trees per step   */
    int spec_rows_left;        /* of which not yet planned this step          */
    double forward_seconds;    /* the last batched forward's wall time        */
    uint64_t spec_steps, spec_tokens;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cairn_request **inbox;     /* guarded by mu */
    size_t inbox_n, inbox_cap;
    bool stopping;             /* guarded by mu */

    /* engine-thread state */
    session **buckets;
    size_t n_buckets, n_sessions, n_keyed;
    /* Stored responses (of n_sessions; never counted toward max_sessions),
     * least recently continued at the head: the first to go. */
    session *resp_head, *resp_tail;
    size_t n_responses;
    int64_t resp_next_sweep;   /* Unix time of the next TTL sweep           */
    uint64_t resp_expired, resp_pushed_out; /* dropped so far, for the log  */
    uint64_t key_clock;        /* named sessions' recency                   */
    job *waiting_head, *waiting_tail;
    size_t n_waiting;
    job **running;
    int n_running;
    job **fetching;            /* admitted, waiting for their fetch event  */
    int n_fetching;
    job *durable;              /* finished, waiting for durability          */
    deferred *deferred;        /* session replies waiting for durability    */
    lookup *lookups;           /* requests waiting for a session's record   */
    bool have_shared;          /* a shared tier (Redis) under the disk tier */
    uint64_t next_cookie;
    bool pages_tight;          /* a job was paused: admit no more until one ends */
    double compute_rate;       /* measured prefill tokens/s (moving average) */
    bool have_disk;
    cairn_seq_batch *batch;
    job **batch_jobs;
    float *logits;             /* [max_seqs][n_vocab] */
    struct sched_sampling *sampling; /* plain steps' sampling where the logits
                                        are (scheduler.c); NULL until the first */
    svc_pin *pins;             /* retention hints held or reserved (pins.c) */
    size_t pin_cap_total;      /* tokens all pins may hold at once          */
    size_t pin_cap_tenant;     /* ... one tenant's                          */
    cairn_service_stats stats;
};

/* ---- events.c ------------------------------------------------------------ */

void svc_emit(cairn_service *s, cairn_event *ev);
void svc_emit_error(cairn_service *s, const cairn_request *r, int code, const char *msg);
void svc_emit_session(cairn_service *s, const cairn_request *r, cairn_session_id id,
                      int64_t n_tokens);
void svc_emit_generation_done(cairn_service *s, job *j);
/* Why a prompt of n_prompt tokens is not (all) cached for `tenant`
 * (explain.c): `cached` is what its admission took (-1: not run, what the
 * tree would give), `waited` whether it waited for another job computing it.
 * Counts the reason in stats.misses. Reads the cache only. */
void svc_explain(cairn_service *s, uint64_t tenant, const int32_t *prompt, size_t n_prompt,
                 int64_t cached, bool waited, cairn_cache_miss *out);
void svc_histogram_observe(cairn_latency_histogram *h, double seconds);
void svc_vllm_observe(cairn_service *s, cairn_vllm_hist which, double seconds);
void svc_note_finished(cairn_service *s, const job *j);
void svc_fill_stats(cairn_service *s, cairn_service_stats *st);
/* The per-tier account of the run, to the log (at stop). */
void svc_log_cache_account(cairn_service *s);

/* ---- sessions.c ---------------------------------------------------------- */

session *session_find(cairn_service *s, cairn_session_id id);
/* A new session with a fresh random id, in the table — a stored response
 * when r (SESSION_OPEN or SESSION_FORK) asks for one, made room for among
 * the stored responses, never `spare` (the one being forked) — NULL after
 * answering r with the error (what is full and what to do). */
session *session_new(cairn_service *s, cairn_request *r, const session *spare);
/* Put a session read from a record into the table (its id is given). */
int session_adopt(cairn_service *s, session *x);
void session_destroy(cairn_service *s, session *x);
/* Its history's cached pages marked live in the cache / unmarked (sessions.c). */
void session_mark_live(cairn_service *s, session *x);
void session_unmark_live(cairn_service *s, session *x);
/* The named session (tenant, key), created when absent (the least recently
 * used idle named session is closed when max_named_sessions are open);
 * NULL with the error emitted. */
session *session_named(cairn_service *s, cairn_request *r);
/* Stored responses (see session.h). A response continued (forked) moves
 * to the back of the line. */
void responses_touch(cairn_service *s, session *x);
/* Whether x is a stored response past its TTL at Unix time `now` (never
 * while it is generating). */
/* When a stored response made at `created` expires under the TTL in force
 * now (0: never). */
int64_t response_deadline(const cairn_service *s, int64_t created);
bool response_expired(const cairn_service *s, const session *x, int64_t now);
/* Drop a stored response: its record deleted, the session destroyed (its
 * pages stay in the cache). */
void response_drop(cairn_service *s, session *x);
/* The TTL sweep (does nothing until it is due), and the bound: the least
 * recently continued idle responses (never `spare`) go until at most
 * `keep` remain; false when that many could not go (all generating). */
void responses_expire(cairn_service *s, int64_t now);
bool responses_trim(cairn_service *s, size_t keep, const session *spare);
/* After records_load: the list in creation order, the expired and the
 * oldest beyond max_responses dropped. */
void responses_loaded(cairn_service *s);
/* Give a session a name (copied); CAIRN_ENOMEM. */
int session_set_key(session *x, const char *key, size_t len);
/* The session r names (by session_key when set, else by id), when the
 * caller may see it; else the error is emitted and NULL returned. */
session *session_of_request(cairn_service *s, cairn_request *r);
/* The same, and not generating (busy_msg is the error otherwise). */
session *session_idle_of_request(cairn_service *s, cairn_request *r, const char *busy_msg);

/* ---- records.c ----------------------------------------------------------- */

/* Queue a durable write (or deletion) of a session's record; the completion
 * comes from the cache with `cookie` (0: nobody waits). */
int record_put(cairn_service *s, const session *x, uint64_t cookie);
int record_delete(cairn_service *s, cairn_session_id id, uint64_t cookie);
/* Delete the shared tier's copy of a session's record (its user closed it,
 * or it was dropped here for good); nothing without a shared tier. */
void record_unshare(cairn_service *s, cairn_session_id id);
/* With a shared tier, a request naming a session not held here waits for
 * the session's record (another replica's session, moved here when that
 * replica died): true when r was parked (the record get is under way);
 * false when there is nothing to look for (handle r now). */
bool records_lookup(cairn_service *s, cairn_request *r);
/* The record get of a parked request completed (data: the value, taken;
 * NULL when absent): the session is adopted when its record is sound, and
 * the request is handled. False when the cookie is nobody's. */
bool records_lookup_done(cairn_service *s, uint64_t cookie, int status, void *data, size_t bytes);
/* At start: sessions back from the records on disk. */
void records_load(cairn_service *s);
/* XXH3-64 of a vocabulary (its size and every token's text, in order): the
 * meaning of a record's token ids. */
uint64_t records_vocab_id(const cairn_vocab *vocab, int n_vocab);
/* At a graceful stop: every open session's record; how many were queued. */
size_t records_write_all(cairn_service *s);

/* ---- jobs.c -------------------------------------------------------------- */

void job_free(job *j);
int job_reserve_pages(job *j, size_t n);
/* Commit the job's computed whole pages to the cache, return the rest and
 * its hold; the leaf that ends at its last whole page (NULL: none). */
cairn_kv_hold *job_release_pages(cairn_service *s, job *j);
/* Make the page table cover n_tokens tokens (CAIRN_EFULL: no pages). */
int job_ensure_pages(cairn_service *s, job *j, size_t n_tokens);
/* KV indices j's pages cover, within the context. */
int job_capacity(const cairn_service *s, const job *j);
/* `base` with the fields `over` sets (non-zero) replaced. */
cairn_spec_params draft_override(cairn_spec_params base, const cairn_spec_params *over);
int job_spec_create(cairn_service *s, job *j);
/* The head over the n tokens j's last forward computed. */
int job_spec_advance(cairn_service *s, job *j, const float *features, int n);
/* The job's method KV final up to its computed tokens (a draft model's
 * partial page), before that page is shared; CAIRN_EINVAL when the job's
 * speculative sequence is not at its computed tokens. */
int job_spec_sync(cairn_service *s, job *j);
/* The time to j's first token, or since its last one, as n tokens (one
 * step's) are taken: TTFT, or n inter-token samples of an n-th each. */
void job_note_tokens_time(cairn_service *s, job *j, int n);
/* Sample j's next token from its logits row; true when j is finished. */
bool job_take_token(cairn_service *s, job *j, float *logits);
/* The same, in three parts, for tokens sampled where the logits are
 * (scheduler.c, model/sample_batch.c): j's grammar mask as bits (false:
 * nothing allowed, finish with job_take_masked_out), then the drawn token. */
bool job_grammar_bits(cairn_service *s, job *j, float *scratch, uint32_t *bits);
bool job_take_masked_out(cairn_service *s, job *j);
bool job_take_sampled(cairn_service *s, job *j, int32_t tok, int status,
                      const cairn_token_logprob *lp);
/* Append a chosen token (sampled, or accepted by a speculative step); true
 * when j is finished. */
/* drawn_by_spec: a speculative step drew it (the matcher and the sampler
 * have seen it already). */
bool job_push_token(cairn_service *s, job *j, int32_t tok, const cairn_token_logprob *lp,
                    bool drawn_by_spec);
/* End j: pages to the cache, session history updated, DONE emitted (when
 * emit_event) now or once its session is durable. Takes j. */
void job_finish(cairn_service *s, job *j, bool emit_event);
void job_fail(cairn_service *s, job *j, int code, const char *msg);
/* The finished job's answer (DONE, or the durability error it met), then
 * free it. */
void job_reply(cairn_service *s, job *j);
/* The draft head failed on j: none of its own pages (which may lack head
 * KV) goes to the cache. */
void job_fail_head(cairn_service *s, job *j);

/* ---- intake.c ------------------------------------------------------------ */

/* Handle one request from the inbox. Takes it. */
void intake_handle(cairn_service *s, cairn_request *r);
/* A durability completion (persist or record) for a finished job or a
 * deferred session reply. */
void intake_durable_done(cairn_service *s, uint64_t cookie, int status);

/* ---- prefix.c ------------------------------------------------------------ */

/* Whether waiting job j should stay queued: a running or fetching job has
 * yet to compute at least a page of prompt that j shares with it. */
bool prefix_should_wait(const cairn_service *s, const job *j);
/* j's fetch (ev) ended where another replica is computing for Redis: true
 * when j goes back to the queue to fetch again later (the fetch's hold is
 * released); false when it should be admitted now. */
bool prefix_wait_remote(cairn_service *s, job *j, const cairn_kvcache_event *ev);
/* When the queue next has a job to admit: 0 = now, INFINITY = empty; a
 * later time when the jobs at its head all wait for other replicas. */
double sched_ready_at(const cairn_service *s);
/* After a step: j's newly computed whole pages go to the tree (its hold
 * moves to their end). */
void prefix_extend(cairn_service *s, job *j);
/* At admission, after the whole-page match: the rows of the next page that
 * j shares with a cached page or a running job's, copied into a page of
 * j's own; how many tokens that saved (added to n_computed), and in *tier the
 * tier those rows came from (device: a page copy; host: an upload). */
size_t prefix_take_partial(cairn_service *s, job *j, int *tier);

/* ---- pins.c -------------------------------------------------------------- */

/* The bounds, from the configuration and the tier-0 pool (at start). */
void pins_bounds(cairn_service *s);
/* At intake, j's seq built: its request's hints as entries (new ones
 * counted against the bounds at once). CAIRN_EQUOTA past a bound, or
 * CAIRN_ENOMEM, with msg[cap] saying what; entries taken so far are given
 * up when j is freed. */
int pins_reserve(cairn_service *s, job *j, char *msg, size_t cap);
/* j finished and committed its pages: lock new entries, refresh deadlines. */
void pins_commit(cairn_service *s, job *j);
/* j is freed: what it did not commit is given up (job_free calls it). */
void pins_job_gone(job *j);
/* Unlock and forget what expired at `now` (cairn_now()); the next deadline
 * (INFINITY: none). */
double pins_sweep(cairn_service *s, double now);
void pins_stats(const cairn_service *s, uint64_t *tokens, uint64_t *prefixes);
/* At stop: every pin released and forgotten. */
void pins_free(cairn_service *s);

/* ---- scheduler.c --------------------------------------------------------- */

void waiting_push(cairn_service *s, job *j, bool front);
job *waiting_pop(cairn_service *s);
/* The running, waiting or fetching job of (client, id), or NULL. */
job *sched_find_job(cairn_service *s, uint64_t client, uint64_t id);
/* Cancel every job of a client. */
void sched_cancel_client(cairn_service *s, uint64_t client);
/* Finish cancelled jobs wherever they are. */
void sched_reap_cancelled(cairn_service *s);
/* Take the cache's finished work: fetched prefixes start running,
 * durability completions release replies. */
void sched_poll_cache(cairn_service *s);
/* Move waiting jobs in while there is room. */
void sched_admit(cairn_service *s);
/* One forward pass over every running job (and speculative steps). */
void sched_step(cairn_service *s);
/* Free the state of sampling where the logits are (service stop). */
void sched_sampling_free(cairn_service *s);

#endif /* CAIRN_SESSION_IMPL_H */
