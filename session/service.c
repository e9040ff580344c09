/*
 * session/service.c — the engine thread: request intake, sessions, and the
 * continuous-batching scheduler over the radix-tree KV cache.
 *
 * Life of a generation request ("job"):
 *
 *   submit ──▶ inbox ──▶ waiting (FIFO) ──admit──▶ running ──finish──▶ event
 *                           ▲                         │
 *                           └──────── pause ──────────┘  (pages ran out)
 *
 *   admit:  match seq[0 .. n-1) against the tree (at least one token is
 *           always computed, for its logits), lock the matched node, take
 *           its device pages as the head of the job's page table.
 *   step:   compute seq[n_computed .. n_computed+chunk) into pages the job
 *           allocated itself; when the chunk reaches the end of seq, sample
 *           one token and append it to seq.
 *   finish: insert the computed whole pages into the tree (the tree takes the
 *           new ones; duplicates are released), unlock, emit DONE.
 *   pause:  the same insert/unlock, then back to the front of `waiting` with
 *           its sequence (prompt + generated so far) and sampler intact; on
 *           re-admission its own pages are found again by prefix match.
 */
#include "session/session.h"

#include "store/store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- session ids --------------------------------------------------------- */

void cairn_session_id_to_hex(cairn_session_id id, char out[33])
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)id.hi, (unsigned long long)id.lo);
}

int cairn_session_id_from_hex(const char *hex, size_t len, cairn_session_id *out)
{
    if (!hex || len != 32)
        return CAIRN_EINVAL;
    uint64_t v[2] = {0, 0};
    for (size_t i = 0; i < 32; i++) {
        char c = hex[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return CAIRN_EINVAL;
        v[i / 16] = v[i / 16] << 4 | (uint64_t)d;
    }
    out->hi = v[0];
    out->lo = v[1];
    return CAIRN_OK;
}

static bool session_id_equal(cairn_session_id a, cairn_session_id b)
{
    return a.hi == b.hi && a.lo == b.lo;
}

/* 128 random bits from the kernel; never a predictable counter, since the id
 * is the only capability a client needs to reach a session. */
static int session_id_random(cairn_session_id *out)
{
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f)
        return CAIRN_EIO;
    size_t got = fread(out, sizeof *out, 1, f);
    fclose(f);
    return got == 1 ? CAIRN_OK : CAIRN_EIO;
}

/* ---- requests ------------------------------------------------------------ */

cairn_request *cairn_request_new(cairn_req_kind kind)
{
    cairn_request *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->kind = kind;
    r->gen.max_tokens = 128;
    r->gen.sampling = cairn_sampling_defaults();
    return r;
}

void cairn_request_free(cairn_request *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->gen.n_stop; i++)
        free(r->gen.stop[i]);
    cairn_grammar_free(r->gen.grammar);
    free(r->tokens);
    free(r);
}

/* ---- token arrays --------------------------------------------------------- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} tokvec;

static int tokvec_reserve(tokvec *t, size_t need)
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

static int tokvec_append(tokvec *t, const int32_t *src, size_t n)
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

/* ---- sessions and jobs ---------------------------------------------------- */

typedef struct session {
    cairn_session_id id;
    tokvec history;
    bool busy;    /* a session.generate is running on it                 */
    bool reply_open; /* the last thing added was a generated reply, without
                        the turn end its end-of-generation token would have
                        been (that token is never kept in the history)   */
    bool persist; /* record and pages are made durable on every change   */
    uint64_t tenant;
    struct session *next;
} session;

typedef struct job {
    cairn_request *req;
    session *sess;           /* session.generate: history to extend           */
    tokvec seq;              /* prompt followed by generated tokens           */
    size_t n_prompt;
    size_t n_computed;       /* tokens of seq whose KV is in pages            */
    bool admitted_once;
    int64_t cached_tokens;   /* reported: matched at the first admission      */
    cairn_kv_hold *hold;     /* the cached prefix it started from (locked) */
    size_t n_tree_pages;     /* pages[0 .. n_tree_pages) belong to the tree   */
    int32_t *pages;          /* page table; the rest were allocated by the job */
    size_t n_pages, pages_cap;
    cairn_sampler *sampler;
    /* Structured output (gen.grammar): masks logits before each draw. Hook
     * for speculative decoding: a job with a matcher must not speculate
     * (drafted tokens would need masking and rollback too). */
    cairn_grammar_matcher *matcher;
    /* With a draft head: keeps the head's KV in the job's pages in step with
     * every forward (always), and decodes speculatively when spec_ok. */
    cairn_eagle_seq *spec;
    bool spec_ok;
    bool spec_failed;        /* adopting the pages failed: the job fails       */
    int spec_span;           /* KV indices a speculative step may write        */
    bool spec_ready;         /* the head has run over the pending token's
                                predecessor (not so right after admission:
                                that row is a page's last, see engine.h)      */
    cairn_detok *detok;
    cairn_token_logprob *lps; /* gen.logprobs: [n_gen][1 + n_logprobs]       */
    size_t lps_cap;
    char *text;              /* generated text so far (stop strings cut off) */
    size_t text_len, text_cap, text_sent;
    size_t tokens_sent;      /* generated tokens already sent in deltas        */
    int n_gen;
    double t_last_token;     /* when the previous token was sampled (0: none) */
    bool cancelled;
    const char *finish;      /* set when the job is done                      */
    int64_t cached_by_tier[3];
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

struct cairn_service {
    cairn_service_config cfg;
    cairn_runtime *rt;         /* borrowed: backend, model, vocab, template */
    cairn_model *model;
    const cairn_vocab *vocab;
    const int32_t *turn_end;   /* the template's turn end, tokenized (the runtime's) */
    size_t n_turn_end;
    cairn_kvcache *cache;
    cairn_kv_layout kv;
    int n_ctx, n_vocab, page_size;
    bool prefix_cache;
    cairn_eagle *eagle;    /* the runtime's draft head, or NULL               */
    cairn_eagle_params draft;
    int draft_max_batch;   /* speculate while at most this many decode; 0 never */
    float *features;       /* [max_batch_tokens][dim] with a head              */
    job **spec_jobs;       /* this step's speculating jobs                    */
    uint64_t spec_steps, spec_tokens;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cairn_request **inbox; /* guarded by mu */
    size_t inbox_n, inbox_cap;
    bool stopping;         /* guarded by mu */

    /* engine-thread state */
    session **buckets;
    size_t n_buckets, n_sessions;
    tokvec key;            /* scratch: a job's tokens as cache keys (tenants) */
    job *waiting_head, *waiting_tail;
    size_t n_waiting;
    job **running;
    int n_running;
    job **fetching;        /* admitted, waiting for their fetch event  */
    int n_fetching;
    job *durable;          /* finished, waiting for durability          */
    deferred *deferred;    /* session replies waiting for durability    */
    uint64_t next_cookie;
    bool pages_tight;      /* a job was paused: admit no more until one ends */
    double compute_rate;   /* measured prefill tokens/s (moving average) */
    bool have_disk;
    cairn_seq_batch *batch;
    job **batch_jobs;
    float *logits;         /* [max_seqs][n_vocab] */
    cairn_service_stats stats;
};

/* ---- latency histograms ---------------------------------------------------- */

/* Seconds; wide enough for a CPU model's first token and a GPU's next one. */
const double cairn_latency_bounds[CAIRN_LATENCY_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5,   1,      2.5,   5,    10,    25,   60,  120};

static void histogram_observe(cairn_latency_histogram *h, double seconds)
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

/* ---- events --------------------------------------------------------------- */

static void emit(cairn_service *s, cairn_event *ev)
{
    if (s->cfg.on_event)
        s->cfg.on_event(ev, s->cfg.user);
}

static void emit_error(cairn_service *s, const cairn_request *r, int code, const char *msg)
{
    cairn_event ev = {.kind = CAIRN_EV_ERROR, .client = r->client, .id = r->id, .code = code,
                      .message = msg};
    emit(s, &ev);
}

static void emit_session(cairn_service *s, const cairn_request *r, cairn_session_id id,
                         int64_t n_tokens)
{
    cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_SESSION, .client = r->client,
                      .id = r->id, .session = id, .n_session_tokens = n_tokens};
    emit(s, &ev);
}

/* ---- session table (engine thread only) ------------------------------------ */

static size_t bucket_of(const cairn_service *s, cairn_session_id id)
{
    return (size_t)((id.lo ^ (id.hi * 0x9e3779b97f4a7c15ull)) % s->n_buckets);
}

static session *session_find(cairn_service *s, cairn_session_id id)
{
    for (session *x = s->buckets[bucket_of(s, id)]; x; x = x->next)
        if (session_id_equal(x->id, id))
            return x;
    return NULL;
}

static int session_create(cairn_service *s, session **out)
{
    if (s->n_sessions >= s->cfg.max_sessions)
        return CAIRN_EFULL;
    session *x = calloc(1, sizeof *x);
    if (!x)
        return CAIRN_ENOMEM;
    int rc;
    do {
        rc = session_id_random(&x->id);
    } while (rc == CAIRN_OK && session_find(s, x->id));
    if (rc) {
        free(x);
        return rc;
    }
    size_t b = bucket_of(s, x->id);
    x->next = s->buckets[b];
    s->buckets[b] = x;
    s->n_sessions++;
    *out = x;
    return CAIRN_OK;
}

static void session_destroy(cairn_service *s, session *x)
{
    session **pp = &s->buckets[bucket_of(s, x->id)];
    while (*pp && *pp != x)
        pp = &(*pp)->next;
    if (*pp)
        *pp = x->next;
    free(x->history.v);
    free(x);
    s->n_sessions--;
}

/* ---- KV pages of a job ------------------------------------------------------ */

static int job_reserve_pages(job *j, size_t n)
{
    if (n <= j->pages_cap)
        return CAIRN_OK;
    size_t cap = j->pages_cap ? j->pages_cap * 2 : 16;
    while (cap < n)
        cap *= 2;
    int32_t *p = realloc(j->pages, cap * sizeof *p);
    if (!p)
        return CAIRN_ENOMEM;
    j->pages = p;
    j->pages_cap = cap;
    return CAIRN_OK;
}

/* Hand the job's computed whole pages to the tree and give back the rest.
 * Returns the tree node that ends at the job's last whole page (NULL when
 * none was inserted). */
static cairn_kv_hold *job_release_pages(cairn_service *s, job *j)
{
    size_t n_full = j->n_computed / (size_t)s->page_size;
    cairn_kv_hold *leaf = NULL;
    /* a sequence's cache key is its tokens in its tenant's namespace */
    cairn_kvcache_commit(s->cache, j->req->tenant, s->prefix_cache ? j->seq.v : NULL, n_full,
                         j->pages, j->n_tree_pages, j->n_pages, j->hold, &leaf);
    j->hold = NULL;
    j->n_pages = j->n_tree_pages = 0;
    j->n_computed = 0;
    return leaf;
}

/* Make the page table cover `n_tokens` tokens, evicting unlocked cached pages
 * if needed. CAIRN_EFULL when that is not enough. */
static int job_ensure_pages(cairn_service *s, job *j, size_t n_tokens)
{
    size_t need = (n_tokens + (size_t)s->page_size - 1) / (size_t)s->page_size;
    if (need <= j->n_pages)
        return CAIRN_OK;
    int rc = job_reserve_pages(j, need);
    if (rc)
        return rc;
    rc = cairn_kvcache_alloc(s->cache, (int32_t)(need - j->n_pages), j->pages + j->n_pages);
    if (rc)
        return rc;
    j->n_pages = need;
    return CAIRN_OK;
}

static void job_free(job *j)
{
    if (!j)
        return;
    cairn_request_free(j->req);
    cairn_sampler_free(j->sampler);
    cairn_grammar_matcher_free(j->matcher);
    cairn_eagle_seq_free(j->spec);
    cairn_detok_free(j->detok);
    free(j->seq.v);
    free(j->pages);
    free(j->text);
    free(j->lps);
    free(j);
}

/* ---- generated text and stop strings ------------------------------------- */

static int job_append_text(job *j, const char *piece, size_t n)
{
    if (j->text_len + n + 1 > j->text_cap) {
        size_t cap = j->text_cap ? j->text_cap * 2 : 256;
        while (cap < j->text_len + n + 1)
            cap *= 2;
        char *t = realloc(j->text, cap);
        if (!t)
            return CAIRN_ENOMEM;
        j->text = t;
        j->text_cap = cap;
    }
    memcpy(j->text + j->text_len, piece, n);
    j->text_len += n;
    j->text[j->text_len] = '\0';
    return CAIRN_OK;
}

/* Cut the text at the first stop string; true when one was found. */
static bool job_check_stop(job *j)
{
    const cairn_gen_params *g = &j->req->gen;
    size_t best = SIZE_MAX;
    for (int i = 0; i < g->n_stop; i++) {
        size_t len = strlen(g->stop[i]);
        if (len == 0)
            continue;
        /* only the unsent tail (plus overlap) can hold a new occurrence */
        size_t from = j->text_sent > len ? j->text_sent - len : 0;
        char *hit = memmem(j->text + from, j->text_len - from, g->stop[i], len);
        if (hit && (size_t)(hit - j->text) < best)
            best = (size_t)(hit - j->text);
    }
    if (best == SIZE_MAX)
        return false;
    j->text_len = best;
    j->text[best] = '\0';
    return true;
}

/* How much of the text may be streamed now: hold back a tail that could be
 * the start of a stop string, ending on a UTF-8 character boundary. */
static size_t job_sendable(const job *j)
{
    const cairn_gen_params *g = &j->req->gen;
    size_t hold = 0;
    for (int i = 0; i < g->n_stop; i++) {
        size_t len = strlen(g->stop[i]);
        for (size_t k = len > 1 ? len - 1 : 0; k > hold; k--)
            if (k <= j->text_len && memcmp(j->text + j->text_len - k, g->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    size_t end = j->text_len - hold;
    while (end > j->text_sent && end < j->text_len && ((unsigned char)j->text[end] & 0xC0) == 0x80)
        end--;
    return end;
}

static void job_emit_delta(cairn_service *s, job *j, bool final)
{
    if (!j->req->gen.stream)
        return;
    size_t end = final ? j->text_len : job_sendable(j);
    const int32_t *gen = j->seq.v + j->n_prompt;
    size_t n_tok = (size_t)j->n_gen - j->tokens_sent;
    if (end <= j->text_sent && n_tok == 0)
        return;
    cairn_event ev = {.kind = CAIRN_EV_DELTA, .client = j->req->client, .id = j->req->id,
                      .text = j->text + j->text_sent,
                      .text_len = end > j->text_sent ? end - j->text_sent : 0,
                      .tokens = gen + j->tokens_sent, .n_tokens = n_tok};
    if (j->lps) {
        ev.n_top = j->req->gen.sampling.n_logprobs;
        ev.logprobs = j->lps + j->tokens_sent * (size_t)(1 + ev.n_top);
    }
    emit(s, &ev);
    if (end > j->text_sent)
        j->text_sent = end;
    j->tokens_sent = (size_t)j->n_gen;
}

/* ---- session records ------------------------------------------------------ */
/*
 * A session's durable record, in the store's "records" database:
 *   key   's' + id.hi (8 bytes, big-endian) + id.lo (8 bytes, big-endian)
 *   value "CSR1" | u32 version (2) | u32 flags (bit 0: persist; bit 1: the
 *         history ends with a generated reply whose turn is not closed yet,
 *         see reply_open) | u32 0 |
 *         u64 tenant | u64 n_tokens | u64 checksum | int32 tokens[n_tokens]
 *         (little-endian)
 * The checksum is XXH3-64 of the key and the value with the checksum field
 * zeroed: a damaged record, or one moved under another session's key, is
 * dropped at start rather than brought back with a wrong history.
 */
#define RECORD_MAGIC "CSR1"
#define RECORD_VERSION 2
#define RECORD_HEADER 40
#define RECORD_SUM_AT 32

static uint64_t record_checksum(const uint8_t key[17], const uint8_t *value, size_t bytes)
{
    /* the key, then the value with its checksum field read as zero */
    static const uint8_t zero[8];
    uint64_t h = XXH3_64bits(key, 17);
    h = XXH3_64bits_withSeed(value, RECORD_SUM_AT, h);
    h = XXH3_64bits_withSeed(zero, 8, h);
    return XXH3_64bits_withSeed(value + RECORD_HEADER, bytes - RECORD_HEADER, h);
}

static void record_key(cairn_session_id id, uint8_t key[17])
{
    key[0] = 's';
    for (int i = 0; i < 8; i++) {
        key[1 + i] = (uint8_t)(id.hi >> (56 - 8 * i));
        key[9 + i] = (uint8_t)(id.lo >> (56 - 8 * i));
    }
}

/* Queue a durable write of the session's record; the completion comes with
 * `cookie`. */
static int record_put(cairn_service *s, const session *x, uint64_t cookie)
{
    size_t n = x->history.n, bytes = RECORD_HEADER + n * sizeof(int32_t);
    uint8_t *v = malloc(bytes), key[17];
    if (!v)
        return CAIRN_ENOMEM;
    uint32_t head[4] = {0, RECORD_VERSION, (x->persist ? 1u : 0u) | (x->reply_open ? 2u : 0u),
                        0};
    memcpy(head, RECORD_MAGIC, 4);
    uint64_t n64 = n, zero = 0;
    memcpy(v, head, 16);
    memcpy(v + 16, &x->tenant, 8);
    memcpy(v + 24, &n64, 8);
    memcpy(v + RECORD_SUM_AT, &zero, 8);
    if (n)
        memcpy(v + RECORD_HEADER, x->history.v, n * sizeof(int32_t));
    record_key(x->id, key);
    uint64_t sum = record_checksum(key, v, bytes);
    memcpy(v + RECORD_SUM_AT, &sum, 8);
    int rc = cairn_kvcache_record_put(s->cache, key, sizeof key, v, bytes, cookie);
    free(v);
    return rc;
}

static int record_delete(cairn_service *s, cairn_session_id id, uint64_t cookie)
{
    uint8_t key[17];
    record_key(id, key);
    return cairn_kvcache_record_delete(s->cache, key, sizeof key, cookie);
}

static void emit_generation_done(cairn_service *s, job *j)
{
    cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_GENERATION,
                      .client = j->req->client, .id = j->req->id, .text = j->text ? j->text : "",
                      .text_len = j->text_len, .tokens = j->seq.v + j->n_prompt,
                      .n_tokens = (size_t)j->n_gen, .finish_reason = j->finish,
                      .logprobs = j->lps, .n_top = j->lps ? j->req->gen.sampling.n_logprobs : 0,
                      .prompt_tokens = (int64_t)j->n_prompt,
                      .cached_tokens = j->cached_tokens, .completion_tokens = j->n_gen};
    memcpy(ev.cached_by_tier, j->cached_by_tier, sizeof ev.cached_by_tier);
    emit(s, &ev);
}

/* ---- finishing ------------------------------------------------------------ */

static void job_finish(cairn_service *s, job *j, bool emit_event)
{
    cairn_kv_hold *leaf = job_release_pages(s, j);
    s->pages_tight = false; /* its pages are free to be evicted now */
    session *x = j->sess;
    if (x) {
        /* the session's history becomes prompt + generated tokens */
        x->busy = false;
        x->reply_open = true;
        x->history.n = 0;
        tokvec_append(&x->history, j->seq.v, j->seq.n);
    }
    if (!emit_event) {
        job_free(j);
        return;
    }
    size_t text_len;
    char tail[300];
    if (cairn_detok_flush(j->detok, tail, sizeof tail, &text_len) == CAIRN_OK && text_len &&
        strcmp(j->finish, "stop") != 0)
        job_append_text(j, tail, text_len);
    job_emit_delta(s, j, true);
    if (x && x->persist && s->have_disk) {
        /* The reply waits until the new history and its pages are durable. */
        j->cookie = ++s->next_cookie;
        j->outstanding = 0;
        if (leaf && cairn_kvcache_persist(s->cache, leaf, j->cookie) == CAIRN_OK)
            j->outstanding++;
        if (record_put(s, x, j->cookie) == CAIRN_OK)
            j->outstanding++;
        else
            j->durable_failed = true;
        if (j->outstanding > 0) {
            j->next = s->durable;
            s->durable = j;
            return;
        }
    }
    if (j->durable_failed)
        emit_error(s, j->req, CAIRN_EIO, "the session could not be made durable");
    else
        emit_generation_done(s, j);
    job_free(j);
}

/* Reply to a session call now, or — for a persisted session — once its
 * record (or its deletion) is durable. Takes nothing; copies what it needs. */
static void reply_session(cairn_service *s, cairn_request *r, session *x, int64_t n_tokens,
                          bool deleted)
{
    if (!x->persist || !s->have_disk) {
        emit_session(s, r, x->id, n_tokens);
        return;
    }
    deferred *d = calloc(1, sizeof *d);
    if (!d) {
        emit_error(s, r, CAIRN_ENOMEM, "out of memory");
        return;
    }
    d->cookie = ++s->next_cookie;
    d->id = x->id;
    d->n_tokens = n_tokens;
    int rc = deleted ? record_delete(s, x->id, d->cookie) : record_put(s, x, d->cookie);
    if (rc != CAIRN_OK) {
        free(d);
        emit_error(s, r, CAIRN_EIO, "the session could not be made durable");
        return;
    }
    /* the request is answered later: keep a copy of what the reply needs */
    d->req = cairn_request_new(r->kind);
    if (!d->req) {
        free(d);
        emit_error(s, r, CAIRN_ENOMEM, "out of memory");
        return;
    }
    d->req->client = r->client;
    d->req->id = r->id;
    d->outstanding = 1;
    d->next = s->deferred;
    s->deferred = d;
}

/* ---- intake ------------------------------------------------------------------ */

static void waiting_push(cairn_service *s, job *j, bool front)
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

static job *waiting_pop(cairn_service *s)
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

/* r->tokens = prefix + r->tokens. */
static int prepend_tokens(cairn_request *r, const int32_t *prefix, size_t n)
{
    int32_t *t = malloc((n + r->n_tokens) * sizeof *t);
    if (!t)
        return CAIRN_ENOMEM;
    memcpy(t, prefix, n * sizeof *t);
    if (r->n_tokens)
        memcpy(t + n, r->tokens, r->n_tokens * sizeof *t);
    free(r->tokens);
    r->tokens = t;
    r->n_tokens += n;
    return CAIRN_OK;
}

/* `base` with the fields `over` sets (non-zero) replaced. */
static cairn_eagle_params draft_override(cairn_eagle_params base, const cairn_eagle_params *over)
{
    if (over->depth)
        base.depth = over->depth;
    if (over->top_k)
        base.top_k = over->top_k;
    if (over->n_draft)
        base.n_draft = over->n_draft;
    return base;
}

/* The job's EAGLE sequence: every job keeps the head's KV of its pages
 * current; it may also speculate when nothing rules that out. */
static int job_spec_create(cairn_service *s, job *j)
{
    const cairn_gen_params *g = &j->req->gen;
    const cairn_eagle_params dp = draft_override(s->draft, &g->draft);
    const cairn_sampling_params *sp = &g->sampling;
    j->spec_ok = !g->no_speculation && !g->grammar && !g->logprobs &&
                 !cairn_sampling_has_penalties(sp) &&
                 s->draft_max_batch > 0;
    /* the pending token and the tree, or the draft's scratch head rows */
    j->spec_span = 1 + (dp.n_draft > (dp.depth - 1) * dp.top_k ? dp.n_draft
                                                                : (dp.depth - 1) * dp.top_k);
    /* its own random stream for sampled acceptance, apart from the sampler's */
    cairn_sampling_params acc = *sp;
    acc.seed = sp->seed ^ 0x9e3779b97f4a7c15ull;
    return cairn_eagle_seq_create(s->eagle, &dp, j->spec_ok ? &acc : NULL, &j->spec);
}

/* Turn a generate / session.generate request into a waiting job. Takes the
 * request. */
static void start_generation(cairn_service *s, cairn_request *r, session *sess)
{
    job *j = calloc(1, sizeof *j);
    int rc = j ? CAIRN_OK : CAIRN_ENOMEM;
    if (rc == CAIRN_OK) {
        j->req = r;
        j->sess = sess;
        if (sess)
            rc = tokvec_append(&j->seq, sess->history.v, sess->history.n);
        if (rc == CAIRN_OK)
            rc = tokvec_append(&j->seq, r->tokens, r->n_tokens);
    }
    const char *msg = "out of memory";
    if (rc == CAIRN_OK && j->seq.n == 0) {
        rc = CAIRN_EINVAL;
        msg = "nothing to generate from: the prompt is empty";
    }
    if (rc == CAIRN_OK && j->seq.n >= (size_t)s->n_ctx) {
        rc = CAIRN_ERANGE;
        msg = "the prompt does not fit in the context";
    }
    if (rc == CAIRN_OK && r->gen.max_tokens < 0) {
        rc = CAIRN_EINVAL;
        msg = "max_tokens must not be negative";
    }
    if (rc == CAIRN_OK) {
        rc = cairn_sampler_create(&r->gen.sampling, s->n_vocab, &j->sampler);
        if (rc)
            msg = "invalid sampling settings";
    }
    if (rc == CAIRN_OK && (rc = cairn_detok_create(s->vocab, false, &j->detok)))
        msg = "out of memory";
    if (rc == CAIRN_OK && r->gen.grammar) {
        const cairn_grammar_vocab *gv = cairn_runtime_grammar_vocab(s->rt);
        rc = gv ? cairn_grammar_matcher_create_with(r->gen.grammar, gv, &j->matcher)
                : CAIRN_ENOMEM;
        if (rc)
            msg = "cannot set up the response format";
    }
    if (rc == CAIRN_OK && s->eagle && (rc = job_spec_create(s, j)) != CAIRN_OK)
        msg = rc == CAIRN_ENOMEM ? "out of memory"
                                 : "invalid draft settings (depth 1..16, top_k 1..16, n 1..255 "
                                   "and below the batch size)";
    if (rc != CAIRN_OK) {
        emit_error(s, r, rc, msg);
        if (j) {
            j->req = NULL;
            job_free(j);
        }
        cairn_request_free(r);
        return;
    }
    j->n_prompt = j->seq.n;
    for (size_t i = 0; i < j->seq.n; i++)
        cairn_sampler_accept(j->sampler, j->seq.v[i]);
    if (sess)
        sess->busy = true;
    if (r->gen.max_tokens == 0) {
        j->finish = "length";
        job_finish(s, j, true);
        return;
    }
    waiting_push(s, j, false);
}

static session *find_session_or_error(cairn_service *s, cairn_request *r)
{
    session *x = session_find(s, r->session);
    if (x && x->tenant != r->tenant)
        x = NULL; /* another tenant's session does not exist for this one */
    if (!x)
        emit_error(s, r, CAIRN_ENOTFOUND, "no such session");
    return x;
}

/* The session a call that changes it names, when it exists for the caller
 * and is not generating; otherwise the error is emitted and NULL returned. */
static session *find_idle_session(cairn_service *s, cairn_request *r, const char *busy_msg)
{
    session *x = find_session_or_error(s, r);
    if (x && x->busy) {
        emit_error(s, r, CAIRN_EBUSY, busy_msg);
        return NULL;
    }
    return x;
}

/* Find a running or waiting job of `client` with msgid `id`. */
static job *find_job(cairn_service *s, uint64_t client, uint64_t id)
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

static void fill_stats(cairn_service *s, cairn_service_stats *st)
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
}

/* Handle one request from the inbox. Takes it. */
static void handle_request(cairn_service *s, cairn_request *r)
{
    session *x = NULL;
    int rc;
    switch (r->kind) {
    case CAIRN_REQ_GENERATE:
        start_generation(s, r, NULL);
        return;
    case CAIRN_REQ_SESSION_OPEN:
        if ((rc = session_create(s, &x)) != CAIRN_OK) {
            emit_error(s, r, rc, rc == CAIRN_EFULL ? "too many open sessions" : "cannot create session");
            break;
        }
        if (r->n_tokens > (size_t)s->n_ctx || tokvec_append(&x->history, r->tokens, r->n_tokens)) {
            session_destroy(s, x);
            emit_error(s, r, CAIRN_ERANGE, "the session's text does not fit in the context");
            break;
        }
        x->persist = r->persist;
        x->tenant = r->tenant;
        if (x->persist && !s->have_disk) {
            session_destroy(s, x);
            emit_error(s, r, CAIRN_EUNSUPPORTED, "persist needs a disk tier (serve --cache-dir)");
            break;
        }
        reply_session(s, r, x, (int64_t)x->history.n, false);
        break;
    case CAIRN_REQ_SESSION_APPEND:
    case CAIRN_REQ_SESSION_GENERATE:
        if (!(x = find_idle_session(s, r, "the session is generating; wait for it to finish")))
            break;
        if (r->chat_turn && x->reply_open && s->n_turn_end > 0 &&
            (rc = prepend_tokens(r, s->turn_end, s->n_turn_end)) != CAIRN_OK) {
            emit_error(s, r, rc, "out of memory");
            break;
        }
        if (x->history.n + r->n_tokens >= (size_t)s->n_ctx) {
            emit_error(s, r, CAIRN_ERANGE, "the session would not fit in the context");
            break;
        }
        if (r->n_tokens > 0 || r->kind == CAIRN_REQ_SESSION_APPEND)
            x->reply_open = false;
        if (r->kind == CAIRN_REQ_SESSION_GENERATE) {
            start_generation(s, r, x);
            return;
        }
        if (tokvec_append(&x->history, r->tokens, r->n_tokens)) {
            emit_error(s, r, CAIRN_ENOMEM, "out of memory");
            break;
        }
        reply_session(s, r, x, (int64_t)x->history.n, false);
        break;
    case CAIRN_REQ_SESSION_FORK: {
        session *child;
        if (!(x = find_session_or_error(s, r)))
            break;
        if ((rc = session_create(s, &child)) != CAIRN_OK) {
            emit_error(s, r, rc, rc == CAIRN_EFULL ? "too many open sessions" : "cannot create session");
            break;
        }
        /* The pages are shared through the tree: the child's history finds
         * the same pages as the parent's. Only the token ids are copied. */
        if (tokvec_append(&child->history, x->history.v, x->history.n)) {
            session_destroy(s, child);
            emit_error(s, r, CAIRN_ENOMEM, "out of memory");
            break;
        }
        /* a fork of a durable session is durable too */
        child->persist = x->persist;
        child->reply_open = x->reply_open;
        child->tenant = x->tenant;
        reply_session(s, r, child, (int64_t)child->history.n, false);
        break;
    }
    case CAIRN_REQ_SESSION_TRUNCATE:
        if (!(x = find_idle_session(s, r, "the session is generating; wait for it to finish")))
            break;
        if (r->n_keep < 0 || (size_t)r->n_keep > x->history.n) {
            emit_error(s, r, CAIRN_EINVAL, "n_tokens is larger than the session");
            break;
        }
        x->history.n = (size_t)r->n_keep;
        x->reply_open = false; /* the cut may be anywhere: the client knows where */
        reply_session(s, r, x, (int64_t)x->history.n, false);
        break;
    case CAIRN_REQ_SESSION_CLOSE:
        if (!(x = find_idle_session(s, r, "the session is generating; cancel it first")))
            break;
        reply_session(s, r, x, 0, true);
        session_destroy(s, x);
        break;
    case CAIRN_REQ_SESSION_INFO:
        if (!(x = find_session_or_error(s, r)))
            break;
        emit_session(s, r, x->id, (int64_t)x->history.n);
        break;
    case CAIRN_REQ_CANCEL: {
        job *j = find_job(s, r->client, r->target);
        if (j)
            j->cancelled = true;
        cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_CANCEL, .client = r->client,
                          .id = r->id, .found = j != NULL};
        emit(s, &ev);
        break;
    }
    case CAIRN_REQ_CACHE_STATS: {
        cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_STATS, .client = r->client,
                          .id = r->id};
        fill_stats(s, &ev.stats);
        emit(s, &ev);
        break;
    }
    case CAIRN_REQ_CLIENT_GONE:
        for (int i = 0; i < s->n_running; i++)
            if (s->running[i]->req->client == r->client)
                s->running[i]->cancelled = true;
        for (job *j = s->waiting_head; j; j = j->next)
            if (j->req->client == r->client)
                j->cancelled = true;
        for (int i = 0; i < s->n_fetching; i++)
            if (s->fetching[i]->req->client == r->client)
                s->fetching[i]->cancelled = true;
        break;
    default:
        emit_error(s, r, CAIRN_EINVAL, "unknown request kind");
        break;
    }
    cairn_request_free(r);
}

/* ---- the scheduler step ------------------------------------------------------ */

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
static void reap_cancelled(cairn_service *s)
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
    if (resident > 0) {
        if (job_reserve_pages(j, resident) != CAIRN_OK ||
            cairn_kvcache_held_pages(s->cache, j->hold, resident, j->pages) != CAIRN_OK)
            resident = 0; /* cannot use it: compute everything */
        j->n_tree_pages = j->n_pages = resident;
        j->n_computed = resident * (size_t)s->page_size;
    }
    if (j->spec) {
        /* head rows of the matched pages are valid (engine.h); pages[] must
         * exist even when empty, capacity is set before every use */
        if (job_reserve_pages(j, 1) != CAIRN_OK ||
            cairn_eagle_seq_adopt(j->spec, cairn_kvcache_kv_base(s->cache), &s->kv, j->pages,
                                  (int)(j->n_pages * (size_t)s->page_size), j->seq.v,
                                  (int)j->seq.n, (int)j->n_computed) != CAIRN_OK)
            j->spec_failed = true;
        j->spec_ready = false;
    }
    if (!j->admitted_once) {
        j->admitted_once = true;
        j->cached_tokens = (int64_t)j->n_computed;
        for (int t = 0; t < 3 && ev && resident > 0; t++) {
            j->cached_by_tier[t] = (int64_t)ev->from_tier[t] * s->page_size;
            s->stats.cached_tokens_by_tier[t] += (uint64_t)j->cached_by_tier[t];
        }
        s->stats.queries++;
        s->stats.prompt_tokens += j->n_prompt;
        s->stats.cached_tokens += j->n_computed;
    }
    s->running[s->n_running++] = j;
}

/* Move waiting jobs in while there is room; each first asks the cache for
 * its prefix (answered asynchronously by a FETCH event). */
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

/* The next waiting job to admit. First come, first served — except that a
 * connection already holding its fair share of the running slots (max_seqs
 * divided among the connections that have work) is passed over while
 * another connection waits, so one client with hundreds of queued requests
 * cannot starve the rest. Work-conserving: with no one else waiting, the
 * head goes in anyway. Removes the job from the queue. */
static job *waiting_pick(cairn_service *s)
{
    job *head = s->waiting_head;
    if (!head || !head->next)
        return waiting_pop(s);
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
    for (const job *j = head; j && n_seen < 64; j = j->next) {
        bool dup = false;
        for (int k = 0; k < n_seen && !dup; k++)
            dup = seen[k] == j->req->client;
        if (!dup)
            seen[n_seen++] = j->req->client;
    }
    int share = (s->cfg.max_seqs + n_seen - 1) / n_seen;
    job *prev = NULL;
    for (job *j = head; j; prev = j, j = j->next) {
        if (client_load(s, j->req->client) >= share)
            continue;
        if (prev) {
            prev->next = j->next;
            if (s->waiting_tail == j)
                s->waiting_tail = prev;
            s->n_waiting--;
            j->next = NULL;
            return j;
        }
        return waiting_pop(s);
    }
    return waiting_pop(s);
}

static void admit(cairn_service *s)
{
    /* After a pause, admitting more would only lock more pages and pause
     * again: wait until a running job finishes (or nothing runs). */
    if (s->pages_tight && s->n_running > 0)
        return;
    s->pages_tight = false;
    while (s->n_running + s->n_fetching < s->cfg.max_seqs && s->waiting_head) {
        job *j = waiting_pick(s);
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

/* A durability completion (persist or record) for a finished job or a
 * deferred session reply. */
static void durable_done(cairn_service *s, uint64_t cookie, int status)
{
    for (job **pp = &s->durable; *pp; pp = &(*pp)->next) {
        job *j = *pp;
        if (j->cookie != cookie)
            continue;
        if (status != CAIRN_OK)
            j->durable_failed = true;
        if (--j->outstanding > 0)
            return;
        *pp = j->next;
        if (j->durable_failed)
            emit_error(s, j->req, CAIRN_EIO, "the session could not be made durable");
        else
            emit_generation_done(s, j);
        job_free(j);
        return;
    }
    for (deferred **pp = &s->deferred; *pp; pp = &(*pp)->next) {
        deferred *d = *pp;
        if (d->cookie != cookie)
            continue;
        /* a record delete of an absent record still leaves it absent */
        if (status != CAIRN_OK && status != CAIRN_ENOTFOUND)
            d->failed = true;
        if (--d->outstanding > 0)
            return;
        *pp = d->next;
        if (d->failed)
            emit_error(s, d->req, CAIRN_EIO, "the session could not be made durable");
        else
            emit_session(s, d->req, d->id, d->n_tokens);
        cairn_request_free(d->req);
        free(d);
        return;
    }
}

/* Take what the cache has finished: fetched prefixes start running;
 * durability completions release replies. */
static void poll_cache(cairn_service *s)
{
    cairn_kvcache_event ev[16];
    int n = 0;
    while (cairn_kvcache_poll(s->cache, ev, 16, &n) == CAIRN_OK && n > 0) {
        for (int i = 0; i < n; i++) {
            switch (ev[i].kind) {
            case CAIRN_KVCACHE_EV_FETCH:
                for (int k = 0; k < s->n_fetching; k++) {
                    job *j = s->fetching[k];
                    if (j->cookie != ev[i].cookie)
                        continue;
                    s->fetching[k] = s->fetching[--s->n_fetching];
                    job_adopt(s, j, &ev[i]); /* cancelled ones are reaped next */
                    break;
                }
                break;
            case CAIRN_KVCACHE_EV_PERSIST:
            case CAIRN_KVCACHE_EV_RECORD_PUT:
            case CAIRN_KVCACHE_EV_RECORD_DELETE:
                durable_done(s, ev[i].cookie, ev[i].status);
                break;
            case CAIRN_KVCACHE_EV_RECORD_GET:
                free(ev[i].data);
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

static bool job_push_token(cairn_service *s, job *j, int32_t tok,
                           const cairn_token_logprob *lp);

/* Sample the next token of `j` from `logits`; returns true when the job is
 * finished (finish reason set). */
static bool job_take_token(cairn_service *s, job *j, float *logits)
{
    int32_t tok;
    double now = cairn_now();
    if (j->t_last_token == 0)
        histogram_observe(&s->stats.ttft, now - j->req->submitted_at);
    else
        histogram_observe(&s->stats.inter_token, now - j->t_last_token);
    j->t_last_token = now;
    /* structured output: tokens that cannot continue the document go */
    if (j->matcher && cairn_grammar_matcher_mask(j->matcher, logits, s->n_vocab) != CAIRN_OK) {
        j->finish = "stop";
        return true;
    }
    const bool want_lp = j->req->gen.logprobs;
    cairn_token_logprob lp[21]; /* the chosen token, then n_logprobs <= 20 */
    if (cairn_sampler_sample(j->sampler, logits, &tok, want_lp ? &lp[0] : NULL,
                             want_lp ? &lp[1] : NULL) != CAIRN_OK) {
        j->finish = "stop";
        return true;
    }
    return job_push_token(s, j, tok, want_lp ? lp : NULL);
}

/* Append the chosen token `tok` to j (sampled here, or accepted by a
 * speculative step); lp: NULL, or the chosen token's logprob then the
 * n_logprobs alternatives. True when the job is finished. */
static bool job_push_token(cairn_service *s, job *j, int32_t tok,
                           const cairn_token_logprob *lp)
{
    const bool want_lp = lp != NULL;
    if (cairn_vocab_is_eog(s->vocab, tok)) {
        j->finish = "stop";
        return true;
    }
    if (j->matcher && cairn_grammar_matcher_accept(j->matcher, tok) != CAIRN_OK) {
        j->finish = "stop"; /* cannot happen after the mask; never emit it */
        return true;
    }
    cairn_sampler_accept(j->sampler, tok);
    if (tokvec_append(&j->seq, &tok, 1)) {
        j->finish = "stop";
        return true;
    }
    if (want_lp) {
        size_t per = 1 + (size_t)j->req->gen.sampling.n_logprobs;
        size_t need = ((size_t)j->n_gen + 1) * per;
        if (need > j->lps_cap) {
            size_t cap = j->lps_cap ? j->lps_cap * 2 : 64 * per;
            cairn_token_logprob *v = realloc(j->lps, cap * sizeof *v);
            if (!v) {
                j->seq.n--;
                j->finish = "stop";
                return true;
            }
            j->lps = v;
            j->lps_cap = cap;
        }
        memcpy(j->lps + (size_t)j->n_gen * per, lp, per * sizeof *lp);
    }
    j->n_gen++;
    s->stats.generated_tokens++;
    char piece[300];
    size_t n = 0;
    if (cairn_detok_push(j->detok, tok, piece, sizeof piece, &n) == CAIRN_OK && n)
        job_append_text(j, piece, n);
    if (job_check_stop(j) || (j->matcher && cairn_grammar_matcher_done(j->matcher))) {
        j->finish = "stop";
        return true;
    }
    if (j->n_gen >= j->req->gen.max_tokens || j->seq.n >= (size_t)s->n_ctx) {
        j->finish = "length";
        return true;
    }
    job_emit_delta(s, j, false);
    return false;
}

static void fail_job(cairn_service *s, job *j, int code, const char *msg)
{
    emit_error(s, j->req, code, msg);
    job_finish(s, j, false);
}

/* The draft head failed on j: its own pages may lack head KV, so none of
 * them goes to the tree. */
static void job_fail_head(cairn_service *s, job *j)
{
    j->n_computed = j->n_tree_pages * (size_t)s->page_size;
    fail_job(s, j, CAIRN_EBACKEND, "the draft head failed");
}

/* KV indices j's pages cover, within the context. */
static int job_capacity(const cairn_service *s, const job *j)
{
    size_t cap = j->n_pages * (size_t)s->page_size;
    return (int)(cap < (size_t)s->n_ctx ? cap : (size_t)s->n_ctx);
}

/* The head over the n tokens j's last forward computed (features[n][dim]). */
static int job_head_advance(cairn_service *s, job *j, const float *features, int n)
{
    int rc = cairn_eagle_seq_set_pages(j->spec, j->pages, job_capacity(s, j));
    if (rc == CAIRN_OK)
        rc = cairn_eagle_seq_advance(j->spec, j->seq.v, (int)j->seq.n, features, n);
    j->spec_ready = rc == CAIRN_OK && j->seq.n > j->n_computed;
    return rc;
}

/* One draft-verify step for each job chosen to speculate this step. */
static void step_speculative(cairn_service *s, int n_spec)
{
    for (int k = 0; k < n_spec; k++) {
        job *j = s->spec_jobs[k];
        int32_t out[17]; /* depth <= 16 */
        int n_out = 0;
        int rc = cairn_eagle_seq_set_pages(j->spec, j->pages, job_capacity(s, j));
        if (rc == CAIRN_OK)
            rc = cairn_eagle_seq_step(j->spec, out, 17, &n_out);
        if (rc != CAIRN_OK || n_out < 1) {
            running_drop(s, j);
            job_fail_head(s, j);
            continue;
        }
        s->spec_steps++;
        s->spec_tokens += (uint64_t)n_out;
        double now = cairn_now();
        if (j->t_last_token == 0)
            histogram_observe(&s->stats.ttft, now - j->req->submitted_at);
        else
            for (int t = 0; t < n_out; t++) /* the step's time, shared by its tokens */
                histogram_observe(&s->stats.inter_token, (now - j->t_last_token) / n_out);
        j->t_last_token = now;
        bool done = false;
        for (int t = 0; t < n_out && !done; t++)
            done = job_push_token(s, j, out[t], NULL);
        /* the accepted tokens' KV is in the pages (the last one is pending);
         * tokens cut by a stop keep theirs, which is the same KV */
        size_t n_past = (size_t)cairn_eagle_seq_n_past(j->spec);
        j->n_computed = n_past < j->seq.n ? n_past : j->seq.n;
        if (done) {
            running_drop(s, j);
            job_finish(s, j, true);
        }
    }
}

/* One forward pass over every running job. Jobs are planned oldest first:
 * each decoder gets one token, prompts share what is left of the batch in
 * chunks. When pages run out, the newest job not yet planned is paused
 * (pause_one); when the job being planned is itself the newest it pauses,
 * unless it is alone — then it cannot fit at all and fails. */
static void step(cairn_service *s)
{
    int n_dec = 0;
    for (int i = 0; i < s->n_running; i++)
        n_dec += s->running[i]->seq.n - s->running[i]->n_computed == 1;
    int prefill_budget = s->cfg.max_batch_tokens - n_dec;
    int n = 0, n_spec = 0;
    /* few decoders: those that may speculate do, each in its own forward */
    const bool speculate = s->eagle && s->draft_max_batch > 0 && n_dec <= s->draft_max_batch;
    for (int i = 0; i < s->n_running;) {
        job *j = s->running[i];
        size_t remaining = j->seq.n - j->n_computed;
        size_t chunk = 1;
        if (j->spec_failed) {
            running_remove(s, i);
            job_fail_head(s, j);
            continue;
        }
        if (speculate && remaining == 1 && j->spec_ok && j->spec_ready &&
            (size_t)cairn_eagle_seq_n_past(j->spec) == j->n_computed) {
            /* pages for the tree; when they cannot be had, decode plainly */
            size_t span = j->n_computed + (size_t)j->spec_span;
            if (span > (size_t)s->n_ctx)
                span = (size_t)s->n_ctx;
            if (job_ensure_pages(s, j, span) == CAIRN_OK) {
                s->spec_jobs[n_spec++] = j;
                i++;
                continue;
            }
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
        int rc;
        while ((rc = job_ensure_pages(s, j, j->n_computed + chunk)) == CAIRN_EFULL &&
               s->n_running - 1 > i)
            pause_one(s, s->running[s->n_running - 1]);
        if (rc == CAIRN_EFULL && s->n_fetching > 0) {
            /* Jobs still fetching hold locks on their prefixes; they join the
             * running set (as its newest) next step and can be paused then. */
            i++;
            continue;
        }
        if (rc == CAIRN_EFULL && i > 0) {
            /* j is the newest: it waits for the older ones to finish */
            running_remove(s, i);
            job_release_pages(s, j);
            waiting_push(s, j, true);
            s->stats.paused++;
            s->pages_tight = true;
            continue;
        }
        if (rc != CAIRN_OK) {
            running_remove(s, i);
            fail_job(s, j, rc == CAIRN_EFULL ? CAIRN_EFULL : rc,
                     rc == CAIRN_EFULL ? "not enough KV cache for this request"
                                       : "cannot allocate KV pages");
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
    if (n == 0) {
        step_speculative(s, n_spec);
        return;
    }
    int n_out = 0, n_tokens = 0;
    for (int b = 0; b < n; b++)
        n_tokens += s->batch[b].n_tokens;
    double t0 = cairn_now();
    /* with a head, every token's feature: the head runs over all of them */
    int rc = s->eagle ? cairn_model_forward_features(s->model, cairn_kvcache_kv_base(s->cache),
                                                     &s->kv, s->batch, n, s->logits, s->features,
                                                     &n_out)
                      : cairn_model_forward(s->model, cairn_kvcache_kv_base(s->cache), &s->kv,
                                            s->batch, n, s->logits, NULL, &n_out);
    /* Steps with real prefill measure how fast tokens are computed; the
     * cache weighs that against load times to decide what to load. */
    double dt = cairn_now() - t0;
    if (rc == CAIRN_OK && n_tokens >= 32 && dt > 0) {
        double rate = n_tokens / dt;
        s->compute_rate = s->compute_rate > 0 ? 0.8 * s->compute_rate + 0.2 * rate : rate;
        cairn_kvcache_set_compute_rate(s->cache, s->compute_rate);
    }
    if (rc != CAIRN_OK) {
        for (int b = 0; b < n; b++) {
            job *j = s->batch_jobs[b];
            running_drop(s, j);
            fail_job(s, j, rc, "the forward pass failed");
        }
        return;
    }
    /* every sequence in the batch returned its last row's logits (needed
     * only where the prompt is finished) */
    const float *features = s->features;
    for (int b = 0; b < n; b++) {
        job *j = s->batch_jobs[b];
        const int n_tok = s->batch[b].n_tokens;
        j->n_computed += (size_t)n_tok;
        bool done = j->n_computed >= j->seq.n &&
                    job_take_token(s, j, s->logits + (size_t)b * s->n_vocab);
        /* the head over the same tokens, now that the next one is known,
         * before the pages can go to the tree */
        if (j->spec && job_head_advance(s, j, features, n_tok) != CAIRN_OK) {
            running_drop(s, j);
            job_fail_head(s, j);
        } else if (done) {
            running_drop(s, j);
            job_finish(s, j, true);
        }
        if (features)
            features += (size_t)n_tok * cairn_model_hparams(s->model)->dim;
    }
    step_speculative(s, n_spec);
}

/* ---- the engine thread --------------------------------------------------------- */

static void *engine_main(void *arg)
{
    cairn_service *s = arg;
    for (;;) {
        /* Disk and copy work finishes on the store's thread: while any is
         * outstanding the loop polls for it instead of sleeping on the
         * condition variable. */
        bool io = s->n_fetching || s->durable || s->deferred;
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->inbox_n == 0 && s->n_running == 0 && !s->waiting_head && !io)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->stopping) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        size_t n_in = s->inbox_n;
        cairn_request **in = NULL;
        if (n_in) {
            in = malloc(n_in * sizeof *in);
            if (in) {
                memcpy(in, s->inbox, n_in * sizeof *in);
                s->inbox_n = 0;
            } else {
                n_in = 0;
            }
        }
        pthread_mutex_unlock(&s->mu);

        for (size_t i = 0; i < n_in; i++)
            handle_request(s, in[i]);
        free(in);
        poll_cache(s);
        reap_cancelled(s);
        admit(s);
        if (s->n_running)
            step(s);
        else if (n_in == 0 && (s->n_fetching || s->durable || s->deferred))
            cairn_kvcache_wait(s->cache, 2);
    }
    /* stopping: running jobs give their computed pages to the tree (so they
     * are flushed to disk below); nothing more is emitted */
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
    return NULL;
}

/* Sessions from the records on disk: persisted ones, and — after a graceful
 * stop — every session that was open. Records of sessions that were not
 * persisted are deleted once read, so a later crash cannot bring back a
 * stale history. */
static int load_record(const void *key, size_t key_len, const void *value, size_t bytes,
                       void *user)
{
    cairn_service *s = user;
    const uint8_t *k = key, *v = value;
    uint32_t head[4];
    uint64_t n;
    if (key_len != 17 || k[0] != 's' || bytes < RECORD_HEADER)
        return 0;
    uint64_t tenant, sum;
    memcpy(head, v, 16);
    memcpy(&tenant, v + 16, 8);
    memcpy(&n, v + 24, 8);
    memcpy(&sum, v + RECORD_SUM_AT, 8);
    cairn_session_id id = {0, 0};
    for (int i = 0; i < 8; i++) {
        id.hi = id.hi << 8 | k[1 + i];
        id.lo = id.lo << 8 | k[9 + i];
    }
    bool ok = memcmp(head, RECORD_MAGIC, 4) == 0 && head[1] == RECORD_VERSION &&
              n <= (uint64_t)s->n_ctx && bytes == RECORD_HEADER + n * sizeof(int32_t) &&
              record_checksum(k, v, bytes) == sum;
    for (uint64_t i = 0; ok && i < n; i++) {
        int32_t t;
        memcpy(&t, v + RECORD_HEADER + i * sizeof t, sizeof t);
        ok = t >= 0 && t < s->n_vocab;
    }
    if (!ok) {
        /* never bring a session back with a history it did not have */
        char hex[33];
        cairn_session_id_to_hex(id, hex);
        cairn_log(CAIRN_LOG_WARN, "service: session record %s failed verification; dropped", hex);
        record_delete(s, id, 0);
        return 0;
    }
    session *x = calloc(1, sizeof *x);
    if (!x || session_find(s, id) || s->n_sessions >= s->cfg.max_sessions ||
        tokvec_append(&x->history, (const int32_t *)(v + RECORD_HEADER), (size_t)n)) {
        if (x)
            free(x->history.v);
        free(x);
        return 0;
    }
    x->id = id;
    x->persist = head[2] & 1;
    x->reply_open = (head[2] & 2) != 0;
    x->tenant = tenant;
    size_t b = bucket_of(s, id);
    x->next = s->buckets[b];
    s->buckets[b] = x;
    s->n_sessions++;
    if (!x->persist)
        record_delete(s, id, 0);
    return 0;
}

/* ---- lifecycle ------------------------------------------------------------------ */

static int failf(char *err, size_t err_len, int rc, const char *msg)
{
    if (err && err_len && !err[0])
        snprintf(err, err_len, "%s", msg);
    return rc;
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
    cairn_service_config *c = &s->cfg;
    if (c->page_size <= 0)
        c->page_size = 16;
    if (c->kv_type != CAIRN_TYPE_F32 && c->kv_type != CAIRN_TYPE_F16) {
        free(s);
        return failf(err, err_len, CAIRN_EINVAL, "kv_type must be F16 or F32");
    }
    if (c->prefill_chunk <= 0)
        c->prefill_chunk = 256;
    if (c->max_sessions == 0)
        c->max_sessions = 4096;
    s->prefix_cache = !c->no_prefix_cache;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);

    int rc;
    s->rt = c->runtime;
    s->model = cairn_runtime_model(s->rt);
    s->vocab = cairn_runtime_vocab(s->rt);
    s->turn_end = cairn_runtime_turn_end(s->rt, &s->n_turn_end);
    s->eagle = cairn_runtime_draft(s->rt);
    {
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
            snprintf(err, err_len, "the service's batch (%d tokens, %d sequences) exceeds what "
                     "the model was loaded for (%d, %d)", c->max_batch_tokens, c->max_seqs, mb,
                     ms);
            rc = CAIRN_EINVAL;
            goto fail;
        }
    }
    const cairn_hparams *hp = cairn_model_hparams(s->model);
    s->n_vocab = hp->n_vocab;
    s->n_ctx = c->n_ctx > 0 ? c->n_ctx : hp->n_ctx_train;
    s->page_size = c->page_size;
    if (s->eagle) {
        /* the head's KV is one more layer of every page */
        if ((rc = cairn_eagle_kv_layout(s->eagle, c->page_size, c->kv_type, &s->kv)))
            goto fail;
        const cairn_eagle_params d = draft_override(cairn_eagle_defaults(), &c->draft);
        s->draft = d;
        s->draft_max_batch = c->draft_max_batch == 0 ? 4 : c->draft_max_batch < 0 ? 0
                                                                                 : c->draft_max_batch;
        cairn_eagle_seq *probe = NULL; /* settings checked once, here */
        if ((rc = cairn_eagle_seq_create(s->eagle, &d, NULL, &probe))) {
            snprintf(err, err_len, "invalid draft settings: depth %d, top-k %d, n %d (n must be "
                     "below the batch size %d)", d.depth, d.top_k, d.n_draft, c->max_batch_tokens);
            goto fail;
        }
        cairn_eagle_seq_free(probe);
        s->features = malloc((size_t)c->max_batch_tokens * hp->dim * sizeof(float));
        s->spec_jobs = calloc((size_t)c->max_seqs, sizeof *s->spec_jobs);
        if (!s->features || !s->spec_jobs) {
            rc = CAIRN_ENOMEM;
            goto fail;
        }
        cairn_log(CAIRN_LOG_INFO, "service: draft head: depth %d, top-k %d, %d draft tokens; "
                  "speculates while at most %d requests decode", d.depth, d.top_k,
                  d.n_draft, s->draft_max_batch);
    } else if ((rc = cairn_model_kv_layout(s->model, c->page_size, c->kv_type, &s->kv))) {
        goto fail;
    }
    if (c->kv_bytes == 0) /* default: room for max_seqs full contexts, at most 1 GiB */
        c->kv_bytes = (size_t)c->max_seqs * ((size_t)s->n_ctx / c->page_size + 1) * s->kv.page_bytes;
    if (c->kv_bytes > ((size_t)1 << 30) && cfg->kv_bytes == 0)
        c->kv_bytes = (size_t)1 << 30;

    uint8_t fp[32]; /* the model's, then the head's: a page holds both's KV */
    cairn_model_fingerprint(s->model, fp);
    if (s->eagle)
        cairn_eagle_fingerprint(s->eagle, fp + 16);
    cairn_page_namespace ns = {.model_fingerprint = fp, .fingerprint_bytes = s->eagle ? 32 : 16,
                               .layout = &s->kv, .layout_version = CAIRN_KV_LAYOUT_VERSION};
    if (c->cache_dir && c->host_bytes == 0)
        c->host_bytes = (size_t)256 << 20; /* disk reads land in host RAM */
    if (c->cache_dir && c->disk_bytes == 0)
        c->disk_bytes = (size_t)4 << 30;
    cairn_kvcache_config kc = {.backend = cairn_runtime_backend(s->rt), .layout = s->kv, .device_bytes = c->kv_bytes,
                               .host_bytes = c->host_bytes, .disk_dir = c->cache_dir,
                               .disk_map_bytes = c->disk_bytes};
    if ((rc = cairn_page_namespace_hash(&ns, &kc.ns)) ||
        (rc = cairn_kvcache_create(&kc, &s->cache, err, err_len)))
        goto fail;

    s->n_buckets = 1024;
    s->buckets = calloc(s->n_buckets, sizeof *s->buckets);
    s->running = calloc((size_t)c->max_seqs, sizeof *s->running);
    s->fetching = calloc((size_t)c->max_seqs, sizeof *s->fetching);
    s->batch = calloc((size_t)c->max_seqs, sizeof *s->batch);
    s->batch_jobs = calloc((size_t)c->max_seqs, sizeof *s->batch_jobs);
    s->logits = malloc((size_t)c->max_seqs * s->n_vocab * sizeof(float));
    if (!s->buckets || !s->running || !s->fetching || !s->batch || !s->batch_jobs || !s->logits) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    s->have_disk = cairn_kvcache_has_disk(s->cache);
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
    if (s->have_disk) {
        cairn_kvcache_record_iterate(s->cache, load_record, s);
        if (s->n_sessions)
            cairn_log(CAIRN_LOG_INFO, "service: %zu sessions restored from %s", s->n_sessions,
                      c->cache_dir);
    }
    if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    s->thread_started = true;
    cairn_log(CAIRN_LOG_INFO, "service: %s, KV %zu pages of %d tokens (%.1f MiB), context %d, "
              "batch %d tokens / %d sequences, prefix cache %s; host tier %.1f MiB, disk tier %s",
              hp->name, (size_t)(c->kv_bytes / s->kv.page_bytes), c->page_size,
              (double)c->kv_bytes / (1 << 20), s->n_ctx, c->max_batch_tokens, c->max_seqs,
              s->prefix_cache ? "on" : "off", (double)c->host_bytes / (1 << 20),
              c->cache_dir ? c->cache_dir : "off");
    *out = s;
    return CAIRN_OK;
fail:
    failf(err, err_len, rc, cairn_strerror(rc));
    cairn_service_stop(s);
    return rc;
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
    if (s->thread_started && s->have_disk) {
        /* Graceful stop: every open session's record, then every page that
         * is not on disk yet; flush waits for both to be committed. */
        size_t n_rec = 0;
        for (size_t b = 0; b < s->n_buckets; b++)
            for (session *x = s->buckets[b]; x; x = x->next)
                n_rec += record_put(s, x, 0) == CAIRN_OK;
        int rc = cairn_kvcache_flush(s->cache);
        cairn_kvcache_stats ks;
        cairn_kvcache_get_stats(s->cache, &ks);
        cairn_log(rc == CAIRN_OK ? CAIRN_LOG_INFO : CAIRN_LOG_ERROR,
                  "service: %s: %zu session records, %llu pages on disk", rc == CAIRN_OK
                  ? "written back" : "write-back failed", n_rec,
                  (unsigned long long)ks.tier[CAIRN_TIER_DISK].pages);
    }
    for (size_t i = 0; i < s->inbox_n; i++)
        cairn_request_free(s->inbox[i]);
    free(s->inbox);
    if (s->cache) {
        /* the per-tier account of the run, as cache.stats reports it */
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
    cairn_kvcache_free(s->cache);
    if (s->eagle)
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
int cairn_service_n_ctx(const cairn_service *s) { return s->n_ctx; }
