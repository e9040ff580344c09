/*
 * session/session.h — the engine thread: sessions and the scheduler that
 * runs every request against one model, reusing cached prefixes.
 *
 * A cairn_service runs one model (a runtime/runtime.h open: backend, weights,
 * vocabulary, template, speculative methods — borrowed, not owned), owns the tiered KV
 * cache (store/store.h, used only through its facade) and a set of sessions,
 * and runs them on one thread of its own — the engine thread of DESIGN.md.
 * Other threads talk to it only through two doors:
 *
 *     loop thread                         engine thread
 *     ───────────                         ─────────────
 *     cairn_service_submit(req) ──queue──▶ admit → match prefix → alloc pages
 *                                          → forward (batched) → sample
 *     on_event(ev)  ◀──────callback─────── deltas, results, errors
 *
 * The scheduler (continuous batching): every step it
 *   1. takes new requests from the queue; a generation request matches its
 *      prompt against the radix tree and locks the matched path, so those
 *      tokens are not recomputed (they are reported as `cached_tokens`).
 *      A match may end inside a page: the rows it shares are copied
 *      (session/prefix.c). Admission is first come, first served, except
 *      that a request sharing at least a page of prompt with one that is
 *      still computing it waits for those pages rather than computing them
 *      too, and a connection holding its share of the running slots
 *      (max_seqs over the connections with work) is passed over while
 *      another one waits;
 *   2. builds one batch: one token for every decoding request, then prompt
 *      chunks (at most `prefill_chunk` tokens per request per step, and at
 *      most `max_batch_tokens` in all) so a long prompt never stalls the
 *      requests that are already decoding;
 *   3. runs the forward pass once for the whole batch, samples, and emits a
 *      delta per request;
 *   4. gives the tree every whole page computed so far (so requests waiting
 *      for a shared prefix can go), and finishes requests (max tokens, end
 *      of generation, a stop string, cancellation), inserting their prompt +
 *      generated tokens into the tree so the next turn finds them (the
 *      partial last page kept as a tail), and unlocking their path.
 * When tier-0 pages run out it evicts unlocked pages first
 * (cairn_kvcache_alloc), and then pauses the most recently admitted request
 * (its pages are released and it is re-queued at the front, to be resumed —
 * by prefix match — when pages free up). A request that could not run even
 * alone fails with an error; nothing is dropped silently and nothing
 * deadlocks. Batching never changes results: a greedy request gives the same
 * tokens alone or among others.
 *
 * Sessions. A session is a 128-bit random id, its committed token history
 * and default sampling settings, and optionally a note: opaque bytes a front
 * end keeps with it (HTTP's Responses API keeps the response object there),
 * stored in its record, never read by the engine. It holds no KV pages while idle: its history
 * finds its pages again in the tree. Fork copies the history (the pages are
 * shared through the tree); truncate shortens it. A named session is one a
 * client reaches by its own key (HTTP's session_id or prompt_cache_key):
 * SESSION_SYNC brings it to the whole prompt the client resent — cut where
 * they part, the rest appended — and generates, in one request, so a front
 * end keeps no copy of any history.
 *
 * Stored responses. A session opened or forked with `response` set is a
 * stored response (the HTTP front end's Responses API, one per call with
 * store: true): the client made it implicitly and never closes it, so it is
 * kept the way OpenAI keeps stored responses, not the way a user's session
 * is. It does not count toward max_sessions (else a few thousand calls
 * would shut out every session); at most max_responses are kept, and
 * making one more first drops the least recently continued (forked) idle
 * one; one expires response_ttl_s after it was created (seen when it is
 * next named, and in a sweep at most once a minute). Dropping one deletes
 * its record; its pages stay in the cache, to be evicted as any others.
 * After a restart the order is the creation time the record keeps, the
 * expired ones are deleted and the oldest beyond max_responses too. Only
 * sessions made with `response` are ever dropped this way: a user's
 * session (open, fork, named) is never expired or pushed out.
 *
 * Tiers and restarts. With host_bytes and cache_dir, pages evicted from
 * tier 0 move to host RAM and then to LMDB instead of being dropped. A
 * request is admitted through cairn_kvcache_fetch: its match continues in
 * host RAM and, past the tree, by page hash on disk (so after a restart a
 * prefix computed before it is found again), and the pages are promoted
 * asynchronously while other requests keep running; the store's cost model
 * (fed with the prefill rate measured here) skips loads slower than
 * recomputing. A persisted session (persist: true) has its record and pages
 * durable before the reply to any call that changed it; every session's
 * record is written, and every page flushed, when the service stops, and
 * records are read back at start.
 *
 * Speculative decoding (the runtime's methods: n-gram lookup, a draft model,
 * an EAGLE head; model.h). Every step, when at most draft_max_batch requests
 * are decoding, each of them that may speculate, and whose measured speed
 * says it pays (cairn_spec_seq_wants_step), decodes by draft + verify
 * (cairn_spec_seq_step: one target forward over its draft tree, 1 or more
 * tokens per step) instead of joining
 * the batch; with more decoding requests all decode plainly, batched. Why
 * the threshold: a batched step already reads the weights once for every
 * sequence, so the memory-bound headroom speculation lives on is used up
 * as the batch grows, while its cost (1 + n draft rows verified per
 * sequence) is not. On a CPU with a tiny model speculation is a slowdown
 * at any batch (bench/eagle/README.md): there set draft_max_batch < 0.
 * A request speculates unless gen.no_speculation; gen.spec_methods picks
 * the methods that propose for it. Output: exactly the tokens it gives
 * without speculation, greedy or seeded, grammar, logprobs and penalties
 * included — the decoder draws each token with the job's own sampler,
 * after the job's grammar mask, as a plain step does (job_spec_create's
 * hooks), and keeps a guess only when it is the token drawn.
 * A head's or draft model's KV is more layers of every page. So that shared
 * and cached pages always hold valid method KV, every forward the service
 * runs (prompt chunks and plain decoding included) is passed on to the
 * methods (cairn_spec_seq_advance); the rule that makes a page's head rows
 * a function of its own token path is in model.h. The page-hash namespace
 * includes the methods' fingerprint (and the layout their extra layers), so
 * pages written by a server without them are never found. n-gram lookup
 * keeps nothing in the pages and changes no namespace.
 *
 * Tenants. A request's `tenant` (a 64-bit value the server derives from the
 * tenant's name, cairn_tenant_id in server/server.h; 0 = none) scopes it:
 * another tenant's session is "not found", and every page it computes or
 * finds is keyed in the tenant's own namespace of the cache (the namespace
 * word of radix.h, given to cairn_kvcache_fetch / _commit): tenants share no
 * page, in memory or on disk, however equal their prompts.
 *
 * Retention. A request may ask (cairn_request.pins) that a prefix of its
 * prompt stay cached: once it ends, the node that ends at that prefix's
 * last whole page is locked in the tree, so its whole path stays in the
 * tier it is in (tier 0, or host RAM) whatever else runs, until the TTL
 * passes; then it is unlocked and ages like any page. A later request
 * pinning the same prefix (same tenant, same tokens) refreshes it: the
 * deadline moves to its end + its TTL when that is later. Bounds, so that
 * one client cannot pin the cache: a tenant's pins hold at most
 * max_pinned_tokens tokens, and all pins together at most half of the
 * tier-0 pool's, so running requests always have pages; each pin counts
 * its whole prefix (pins sharing a prefix count it twice). A request whose
 * new pins would pass a bound fails at once with CAIRN_EQUOTA, naming the
 * bound, before anything runs; it is never served without its pin. Pins
 * live in memory only (a restart forgets them; with a disk tier the pages
 * are found there). The engine wakes for the next deadline while idle.
 * With no_prefix_cache nothing is cached, so hints are accepted and keep
 * nothing.
 *
 * Threads and ownership. cairn_service_start/stop are called by the owner
 * thread. cairn_service_submit is thread-safe and takes ownership of the
 * request. on_event runs on the engine thread; the event and everything it
 * points to are valid only during the call (copy what you keep). The vocab
 * returned by cairn_service_vocab is immutable and may be read from any
 * thread (tokenization happens on the caller's side).
 */
#ifndef CAIRN_SESSION_H
#define CAIRN_SESSION_H

#include "runtime/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cairn_service cairn_service;

/* 128-bit session id; on the wire as 32 lowercase hex digits. */
typedef struct {
    uint64_t hi, lo;
} cairn_session_id;

/* 32 lowercase hex digits and a NUL. */
void cairn_session_id_to_hex(cairn_session_id id, char out[33]);
/* CAIRN_EINVAL unless `hex` is exactly 32 hex digits. */
int cairn_session_id_from_hex(const char *hex, size_t len, cairn_session_id *out);

#define CAIRN_MAX_STOP 8 /* stop strings per request */
#define CAIRN_MAX_PINS 4 /* retention hints per request (Anthropic's breakpoints) */
#define CAIRN_PIN_MAX_TTL_S 86400.0 /* the longest a hint keeps a prefix (24 h) */
#define CAIRN_SESSION_NOTE_MAX (8u << 20) /* bytes of a session's note */

typedef struct {
    int max_tokens;                 /* tokens to generate at most (>= 0)       */
    cairn_sampling_params sampling;
    int n_stop;
    char *stop[CAIRN_MAX_STOP];     /* owned by the request (malloc'ed)        */
    bool stream;                    /* emit DELTA events as tokens come        */
    bool logprobs;                  /* events carry each generated token's
                                       logprob and sampling.n_logprobs
                                       alternatives (event.logprobs)           */
    cairn_grammar *grammar;         /* owned by the request, may be NULL: the
                                       output must follow it (structured
                                       output; text/text.h); the job finishes
                                       ("stop") when the document is done     */
    bool ignore_eos;                /* keep generating past end-of-generation
                                       tokens (they are kept in the output) */
    bool no_speculation;            /* never decode this request with the
                                       server's speculative methods (see "Speculative
                                       decoding" above)                       */
    uint32_t spec_methods;          /* the server's methods that propose for
                                       this request (cairn_spec_method_mask
                                       bits); 0 = all                     */
    cairn_spec_params draft;        /* draft tree for this request; fields
                                       left 0 take the server's settings     */
} cairn_gen_params;

typedef enum {
    CAIRN_REQ_GENERATE = 1,     /* tokens, gen              -> DONE(generation)  */
    CAIRN_REQ_SESSION_OPEN,     /* tokens (initial history) -> DONE(session)     */
    CAIRN_REQ_SESSION_APPEND,   /* session, tokens          -> DONE(session)     */
    CAIRN_REQ_SESSION_GENERATE, /* session, gen (+tokens appended first)
                                                            -> DONE(generation)  */
    CAIRN_REQ_SESSION_SYNC,     /* session_key, tokens (the whole prompt), gen:
                                   the named session (created when absent)
                                   is cut where its history and the prompt
                                   part and the rest appended, then it
                                   generates                -> DONE(generation)  */
    CAIRN_REQ_SESSION_FORK,     /* session                  -> DONE(session: new) */
    CAIRN_REQ_SESSION_TRUNCATE, /* session, n_keep          -> DONE(session)     */
    CAIRN_REQ_SESSION_CLOSE,    /* session                  -> DONE(session)     */
    CAIRN_REQ_SESSION_INFO,     /* session                  -> DONE(session, with
                                                               its note)         */
    CAIRN_REQ_CANCEL,           /* target (same client)     -> DONE(cancel)      */
    CAIRN_REQ_CACHE_STATS,      /*                          -> DONE(stats)       */
    CAIRN_REQ_CLIENT_GONE,      /* cancel all of `client`; no event              */
    CAIRN_REQ_SESSION_NOTE,     /* session, note: the bytes the session keeps for
                                   its client replaced (durable with a persisted
                                   session's record)        -> DONE(session)     */
    CAIRN_REQ_SESSION_LIST,     /* the asking tenant's open sessions (at most
                                   CAIRN_SESSION_LIST_MAX)  -> DONE(session_list) */
    CAIRN_REQ_CACHE_EXPLAIN,    /* tokens (a prompt): what the cache holds of
                                   it for the asking tenant, without running
                                   it or touching the cache's recency
                                                            -> DONE(explain)     */
} cairn_req_kind;

typedef struct {
    cairn_req_kind kind;
    uint64_t client;           /* connection id: scope of cancel and of events  */
    uint64_t id;               /* the client's msgid, echoed in every event     */
    cairn_session_id session;
    char *session_key;         /* SESSION_SYNC: the session's name, a client's
                                  key for its conversation (owned, malloc'ed;
                                  1..1024 bytes); names are per tenant.
                                  The calls that name a session by id
                                  (APPEND, GENERATE, FORK, TRUNCATE, CLOSE,
                                  INFO, NOTE) take it instead of `session`
                                  when set: the named session is found,
                                  never created (`cairn chat`'s /load)     */
    size_t session_key_len;
    int32_t *tokens;           /* owned by the request (malloc'ed), may be NULL */
    size_t n_tokens;
    cairn_gen_params gen;
    uint64_t target;           /* CANCEL: msgid of the request to cancel        */
    int64_t n_keep;            /* TRUNCATE: tokens to keep                      */
    bool persist;              /* SESSION_OPEN: make the session durable        */
    bool response;             /* SESSION_OPEN, SESSION_FORK: the new session
                                  is a stored response (HTTP's Responses
                                  API): counted apart from max_sessions,
                                  bounded by max_responses and expiring
                                  after response_ttl_s (see "Stored
                                  responses" above)                          */
    char *note;                /* SESSION_NOTE: the note (owned, malloc'ed; at
                                  most CAIRN_SESSION_NOTE_MAX bytes; NULL or 0
                                  bytes: none)                                */
    size_t note_len;
    bool chat_turn;            /* APPEND/GENERATE: `tokens` are chat messages
                                  formatted to continue the conversation; an
                                  assistant reply the last generation left
                                  open is closed first with the template's
                                  turn end (e.g. "<|im_end|>\n")           */
    uint64_t tenant;           /* who asks (0: no tenants). Sessions belong to
                                  the tenant that opened them; cached prefixes
                                  are shared only within a tenant.           */
    double submitted_at;       /* set by cairn_service_submit (cairn_now):
                                  time to first token is measured from here   */
    /* Retention hints (Anthropic's cache_control, OpenAI's
     * prompt_cache_retention, the native cache_pin; see "Retention" above):
     * GENERATE and the session generations keep the first pins[i].tokens
     * tokens of the sequence they run on (session history + tokens; 0: all
     * of the prompt), cut to whole pages, locked in the tier they are in
     * for ttl_s (0 < ttl_s <= CAIRN_PIN_MAX_TTL_S) seconds after the
     * request ends. */
    int n_pins;
    struct {
        size_t tokens;
        double ttl_s;
    } pins[CAIRN_MAX_PINS];
    bool session_looked_up;    /* the engine's own: `session` was not held here
                                  and its record has been looked for (disk,
                                  then the shared tier) */
} cairn_request;

/* A zeroed request with default generation settings; free with
 * cairn_request_free unless it was handed to cairn_service_submit. */
cairn_request *cairn_request_new(cairn_req_kind kind);
void cairn_request_free(cairn_request *r);

typedef enum {
    CAIRN_EV_DELTA = 1, /* newly generated text and tokens of a streaming request */
    CAIRN_EV_DONE,      /* the request finished; see `what`                        */
    CAIRN_EV_ERROR,     /* the request failed: code, message                      */
} cairn_event_kind;

typedef enum {
    CAIRN_DONE_GENERATION = 1, /* text, tokens, finish_reason, usage */
    CAIRN_DONE_SESSION,        /* session, n_session_tokens, closed   */
    CAIRN_DONE_CANCEL,         /* cancelled: whether the target existed */
    CAIRN_DONE_STATS,          /* stats                               */
    CAIRN_DONE_SESSION_LIST,   /* sessions, n_listed                  */
    CAIRN_DONE_EXPLAIN,        /* prompt_tokens, cached_tokens (what a run
                                  would find), miss                     */
} cairn_done_what;

/* Why a prompt was (partly) recomputed: the engine's answer, in
 * cairn_event.miss of DONE(generation) and DONE(explain). The engine knows
 * the cache, not the request's structure: where the prompt departed from
 * the closest cached sequence inside it, it says CAIRN_MISS_DEPARTED and the
 * front end, which has the conversation (api.h), names the part: system,
 * tools, an earlier turn (history), or the new turn.
 *
 * Rules, first that applies (see docs/why-recomputed.md):
 *   IN_FLIGHT      the request waited for another request that was computing
 *                  its prefix (session.h's "wait" rule, prefix.c) — reported
 *                  even though it then reused it: at arrival it was not cached
 *   NONE           everything but the last page's worth was cached (a hit)
 *   EVICTED        the page after the match was dropped by eviction recently
 *                  (evicted_tier: the tier it was lost from)
 *   NO_CACHE       the tenant has nothing cached at all (a fresh server, a
 *                  restart without a cache directory)
 *   OTHER_TENANT   (the tenant has nothing, or) another tenant holds more
 *                  whole pages of this prompt
 *   EVICTED        cached pages in a slower tier were not loaded
 *                  (recomputing them was judged cheaper; evicted_tier device)
 *   NEW_CONTENT    the prompt holds a whole cached sequence and goes on
 *   DEPARTED       it departs inside a cached sequence (front end refines) */
typedef enum {
    CAIRN_MISS_NONE = 0,
    CAIRN_MISS_NEW_CONTENT,
    CAIRN_MISS_HISTORY_REWRITTEN,
    CAIRN_MISS_SYSTEM_CHANGED,
    CAIRN_MISS_TOOLS_CHANGED,
    CAIRN_MISS_EVICTED,
    CAIRN_MISS_IN_FLIGHT,
    CAIRN_MISS_OTHER_TENANT,
    CAIRN_MISS_NO_CACHE,
    CAIRN_MISS_DEPARTED, /* engine only: the front end names the part */
    CAIRN_MISS_REASONS
} cairn_miss_reason;

/* The wire name of a reason ("new_content", ..., "other_tenant_only",
 * "no_cache"); NULL for NONE. DEPARTED reads "new_content" (a prompt with
 * no structure to tell parts apart: it went on differently). */
const char *cairn_miss_reason_name(cairn_miss_reason r);

#define CAIRN_MISS_EXCERPT 8 /* tokens of each side at the departure */

typedef struct {
    bool known;              /* looked up: prefix caching is on and the prompt
                                has two tokens or more; all else is 0 if not */
    cairn_miss_reason reason;
    int64_t departure;       /* prompt tokens equal to the closest cached
                                sequence of the tenant (token-exact)       */
    int64_t closest_tokens;  /* where that sequence's node ends             */
    int tier;                /* tier the shared part was in: 0 device, 1 host,
                                2 disk; -1 when nothing is shared            */
    int evicted_tier;        /* EVICTED: the tier it was lost from; else -1   */
    int32_t prompt_next[CAIRN_MISS_EXCERPT]; /* the prompt from the departure */
    int32_t cached_next[CAIRN_MISS_EXCERPT]; /* the cached side (same tenant)  */
    int n_prompt_next, n_cached_next;
} cairn_cache_miss;

#define CAIRN_SESSION_LIST_MAX 256
#define CAIRN_SESSION_NAME_SHOWN 64 /* bytes of a name a listing carries */

/* One session of a SESSION_LIST answer. Only the asking tenant's sessions
 * are listed (tenant 0: those opened without tenants). */
typedef struct {
    cairn_session_id id;
    char name[CAIRN_SESSION_NAME_SHOWN]; /* a named session's name, cut to fit
                                            (NUL-terminated); "" when unnamed */
    int64_t n_tokens;          /* its history                               */
    bool persist;              /* its record and pages are durable (disk)    */
    bool busy;                 /* generating now                             */
    uint64_t last_used;        /* named sessions: larger = used more recently */
} cairn_session_entry;

/* One tier of the KV cache (0 device, 1 host RAM, 2 disk). */
typedef struct {
    uint64_t pages, bytes;              /* in the tier now                    */
    uint64_t hit_tokens, miss_tokens;   /* lookups that reached this tier     */
    uint64_t evicted_pages;             /* moved out (disk: dropped)          */
    uint64_t promoted_pages;            /* moved up toward the device         */
    uint64_t load_ops, store_ops;
    double load_mean_s, store_mean_s;   /* mean latency of one load / store   */
} cairn_service_tier_stats;

/* Latency histograms (Prometheus style): upper bounds in seconds of the
 * buckets; one more bucket, above the last bound, is +Inf. */
#define CAIRN_LATENCY_BUCKETS 16
extern const double cairn_latency_bounds[CAIRN_LATENCY_BUCKETS];

typedef struct {
    uint64_t counts[CAIRN_LATENCY_BUCKETS + 1]; /* per bucket, not cumulative */
    uint64_t count;
    double sum_s;
} cairn_latency_histogram;

/* The same measurements again on vLLM's bucket boundaries, for the vllm:
 * names of /metrics (docs/openai.md): routers and autoscalers written for
 * vLLM compare their buckets. The server as a whole, every tenant together
 * (vLLM has no tenants). Observed on the engine thread:
 *   TTFT       submit -> first token sampled (as cairn_service_stats.ttft)
 *   ITL        between a request's decode steps: once per step, however many
 *              tokens a speculative step gave (as vLLM counts it)
 *   E2E        submit -> finished
 *   QUEUE      submit -> first admission
 *   PREFILL    first admission -> first token
 *   DECODE     first token -> last token
 *   INFERENCE  first admission -> last token
 *   TPOT       a request's DECODE time over its tokens after the first (0
 *              with one token): one mean per request, on ITL's buckets
 * E2E counts every finished request; the last five only those that were
 * admitted and sampled a token. */
typedef enum {
    CAIRN_VLLM_TTFT,
    CAIRN_VLLM_ITL,
    CAIRN_VLLM_E2E,
    CAIRN_VLLM_QUEUE,
    CAIRN_VLLM_PREFILL,
    CAIRN_VLLM_DECODE,
    CAIRN_VLLM_INFERENCE,
    CAIRN_VLLM_TPOT,
    CAIRN_VLLM_HISTS
} cairn_vllm_hist;

#define CAIRN_VLLM_BUCKETS_MAX 22

typedef struct {
    uint64_t counts[CAIRN_VLLM_BUCKETS_MAX + 1]; /* per bucket, not cumulative;
                                                    [n_bounds] is +Inf     */
    uint64_t count;
    double sum_s;
} cairn_vllm_histogram;

/* The upper bounds (seconds, ascending) of histogram h's buckets; *n
 * receives how many (at most CAIRN_VLLM_BUCKETS_MAX). */
const double *cairn_vllm_bounds(cairn_vllm_hist h, int *n);

/* vLLM's finished_reason values, for requests that ended: cancelled ones
 * are "abort", admitted ones the engine failed (a forward pass, speculation,
 * KV pages it could not get) "error"; requests refused before admission are
 * not counted. vLLM's fifth reason, "repetition", cairn never gives. */
typedef enum {
    CAIRN_VLLM_FINISH_STOP,
    CAIRN_VLLM_FINISH_LENGTH,
    CAIRN_VLLM_FINISH_ABORT,
    CAIRN_VLLM_FINISH_ERROR,
    CAIRN_VLLM_FINISHES
} cairn_vllm_finish;

typedef struct {
    uint64_t queries;          /* generation requests admitted              */
    uint64_t prompt_tokens;    /* prompt tokens of those requests           */
    uint64_t cached_tokens;    /* of which served from the cache            */
    uint64_t generated_tokens;
    uint64_t pages[3];         /* pages in the tree per tier (device, host, disk) */
    uint64_t device_pages_total, device_pages_free;
    uint64_t evicted_pages;    /* pages moved out of tier 0                 */
    uint64_t paused;           /* requests paused for lack of pages         */
    uint64_t running, waiting; /* requests now                              */
    uint64_t sessions;         /* open sessions (what max_sessions bounds)   */
    uint64_t stored_responses; /* stored Responses kept (max_responses)      */
    cairn_service_tier_stats tiers[3];
    uint64_t cached_tokens_by_tier[4]; /* cached_tokens by where they were found:
                                          device, host, disk, shared */
    uint64_t partial_tokens;   /* of cached_tokens: rows reused from part of a page */
    uint64_t misses[CAIRN_MISS_REASONS]; /* prompts not (all) cached, by the
                                  engine's reason (cairn_cache_miss; DEPARTED
                                  is refined by the front ends, which count
                                  the final reasons themselves)              */
    uint64_t explains;         /* CAIRN_REQ_CACHE_EXPLAIN answered           */
    uint64_t pinned_tokens;    /* tokens of the prefixes retention hints hold
                                  now (each pin counted whole)               */
    uint64_t pinned_prefixes;  /* those prefixes (pins)                      */
    uint64_t pins_refused;     /* hints refused at a tenant's or the global bound */
    uint64_t shared_waits;     /* admissions deferred until another request had
                                  computed the prefix they share              */
    uint64_t remote_waits;     /* ... until another replica had (its pages
                                  came through the shared tier)              */
    uint64_t remote_wait_timeouts; /* of those, waits given up: no new pages
                                  for shared_wait_s                          */
    struct {                   /* write-behind to the disk tier (store.h)   */
        uint64_t pages;        /* pages of reused prefixes committed to LMDB */
        uint64_t queued;       /* ... queued (committed or still in flight) */
        uint64_t waiting;      /* reused prefixes waiting to be written now */
        uint64_t dropped;      /* reused prefixes not queued (queue full)   */
        double seconds;        /* engine-thread time spent copying pages    */
    } behind;
    cairn_latency_histogram ttft;        /* submit -> first token sampled    */
    cairn_latency_histogram inter_token; /* between a request's tokens       */
    cairn_vllm_histogram vllm[CAIRN_VLLM_HISTS]; /* on vLLM's buckets (above) */
    uint64_t finished[CAIRN_VLLM_FINISHES]; /* requests ended, by vLLM's reason */
    uint64_t device_pages_in_use; /* distinct tier-0 pages held by running
                                     requests now; pages only the prefix tree
                                     holds are reclaimable and not counted
                                     (vLLM's kv_cache_usage_perc)          */
    int page_size;             /* tokens per KV page                         */
    bool prefix_cache;         /* prefix caching on                          */
    struct {                   /* tier 3, Redis (store.h); zero without one  */
        bool on, up;
        uint64_t hits, misses;  /* page reads that missed in LMDB           */
        uint64_t corrupt;       /* values that failed their checks (deleted) */
        uint64_t puts, dropped, errors, events, outages, queued_bytes;
        uint64_t pages_queued;  /* pages this replica chose to share         */
    } shared;
    struct {                   /* KV events (config.kv_events); zero without */
        bool on;
        uint64_t events, batches; /* published                               */
        uint64_t dropped;       /* refused by a full queue                   */
        uint64_t resyncs;       /* full re-announcements after drops          */
        uint64_t replays;       /* replay requests answered                   */
    } kv_events;
} cairn_service_stats;

typedef struct {
    cairn_event_kind kind;
    cairn_done_what what;
    uint64_t client, id;
    /* DELTA and DONE(generation): text is complete UTF-8 (DONE: all of it) */
    const char *text;
    size_t text_len;
    const int32_t *tokens;
    size_t n_tokens;
    /* with gen.logprobs: per token of `tokens`, 1 + n_top entries — the
     * chosen token, then the n_top most likely, best first (cairn_sampler_
     * sample's values: the distribution the sampler drew from, after any
     * grammar mask). NULL without. */
    const cairn_token_logprob *logprobs;
    int n_top;
    /* DONE(generation) */
    const char *finish_reason; /* "stop", "length" or "cancelled"          */
    int32_t eog_token;         /* the end-of-generation token that stopped it
                                  (not in `tokens`), or -1                   */
    int stop_string;           /* the stop string that ended it: 1 + its index
                                  in gen.stop; 0 when none did               */
    int64_t prompt_tokens, cached_tokens, completion_tokens;
    cairn_cache_miss miss;     /* DONE(generation), DONE(explain): why the
                                  uncached part of the prompt was not cached */
    int64_t cached_by_tier[4]; /* where the cached tokens were: device, host,
                                  disk (this replica's LMDB), shared (Redis) */
    double prompt_seconds;     /* admission to the first token (prefill)    */
    double decode_seconds;     /* first token to the last                    */
    int64_t spec_forwards;     /* speculative steps (target verifications)  */
    int64_t spec_tokens;       /* tokens they gave (tau = tokens / forwards) */
    int64_t spec_drafted;      /* draft tokens verified                     */
    int64_t spec_accepted;     /* of them accepted                           */
    char spec_method[48];      /* the methods that proposed ("ngram", ...);
                                  "" when the request never speculated. Held
                                  in the event: it outlives the job, which
                                  events do (they are copied by value)      */
    /* DONE(session) */
    cairn_session_id session;
    int64_t n_session_tokens;
    const char *note;          /* SESSION_INFO: the session's note (NULL: none) */
    size_t note_len;
    /* DONE(cancel) */
    bool found;
    /* DONE(stats) */
    cairn_service_stats stats;
    /* DONE(session_list) */
    const cairn_session_entry *sessions;
    size_t n_listed;
    /* ERROR */
    int code;                  /* CAIRN_E* */
    const char *message;
} cairn_event;

typedef void (*cairn_event_fn)(const cairn_event *ev, void *user);

/* When pages in host RAM or on disk are loaded rather than recomputed. */
typedef enum {
    CAIRN_LOAD_MEASURED = 0, /* when loading is expected to be faster, from the
                                rates measured as the server runs (default)  */
    CAIRN_LOAD_ALWAYS,       /* whenever they are cached (deterministic: tests) */
    CAIRN_LOAD_NEVER,        /* only tier-0 pages are used (comparisons)      */
} cairn_load_policy;

typedef struct {
    cairn_runtime *runtime; /* the model, its backend and text (borrowed; must
                               outlive the service). With speculative methods
                               the service decodes speculatively (see above). */
    size_t kv_bytes;        /* tier-0 KV budget                              */
    int page_size;          /* tokens per page (default 16)                  */
    cairn_type kv_type;     /* a KV type (kernels/backend.h): F32 (= 0), F16,
                               BF16, Q8_0 or Q4_0                             */
    int n_ctx;              /* most tokens in one sequence (default: model's) */
    int max_batch_tokens;   /* tokens per forward step (default: what the
                               runtime's model was loaded for; never more)   */
    int max_seqs;           /* requests running at once (default 32, at most
                               the model's max_seqs)                         */
    int prefill_chunk;      /* prompt tokens per request per step (default 256) */
    int progress_ms;        /* a prompt still computing after this long logs
                               its progress, then at most this often
                               (default 1000; < 0: never)                    */
    size_t max_sessions;    /* open sessions at most (default 4096)          */
    size_t max_named_sessions; /* named sessions (SESSION_SYNC) at most; the
                               least recently used idle one is closed to make
                               room (default 1024)                           */
    size_t max_responses;   /* stored responses kept at most, apart from
                               max_sessions; the least recently continued
                               idle one goes to make room (default 10000) */
    double response_ttl_s;  /* a stored response expires this long after it
                               was created (default 30 days, as OpenAI's;
                               < 0: never)                                  */
    bool no_prefix_cache;   /* never reuse cached prefixes (for comparisons) */
    size_t host_bytes;      /* tier-1 host RAM budget (0: none; default 256 MiB
                               when cache_dir is set)                        */
    const char *cache_dir;  /* tier-2 LMDB directory (NULL: no disk tier)     */
    size_t disk_bytes;      /* LMDB map size (default 4 GiB)                  */
    const struct cairn_shared_config *shared; /* tier 3 (store/store.h): a
                               Redis shared by replicas, under the disk tier
                               (needs cache_dir); NULL: none. Read at start. */
    int share_policy;       /* which pages go to tier 3: CAIRN_SHARE_* of
                               store/store.h (default: reused ones)          */
    double shared_wait_s;   /* with tier 3: a request whose prefix another
                               replica is computing for Redis waits for its
                               pages, fetching again, until this long passes
                               without new ones (then computes the rest);
                               0 = 5 s, < 0 = never waits (session/prefix.c) */
    bool plain_lru;         /* evict in plain LRU order, not by class (radix.h,
                               "Eviction order"): for comparisons           */
    bool no_write_behind;   /* with cache_dir: do not write reused prefixes'
                               pages to disk in the background (the default
                               writes them, so that a SIGKILL keeps them:
                               store.h, "Write-behind")                      */
    size_t max_pinned_tokens; /* retention hints: the tokens one tenant's
                               pins may hold at once (0: a quarter of the
                               tier-0 pool); all tenants together never
                               more than half of it                      */
    const char *kv_events;  /* publish the pages this replica holds in vLLM's
                               KV-event format on a ZMQ PUB socket bound here
                               ("tcp://HOST:PORT"; kvevents/kvevents.h); NULL:
                               none                                          */
    const char *kv_events_replay; /* ... and answer replay requests on a ROUTER
                               socket bound here (NULL: none)                */
    const char *kv_events_topic;  /* frame 0 of every message (NULL: "")     */
    cairn_load_policy load_policy;
    cairn_spec_params draft; /* default draft settings; 0 fields: engine defaults */
    int draft_max_batch;    /* speculate while at most this many requests
                               decode (0: default 4; < 0: never)             */
    cairn_event_fn on_event;
    void *user;
} cairn_service_config;

/* Allocate every pool once and start the engine thread on the runtime's
 * model. err receives a message on failure. The caller owns *out. */
int cairn_service_start(const cairn_service_config *cfg, cairn_service **out, char *err,
                        size_t err_len);

/* Finish nothing more: cancel what runs (no events are emitted after stop
 * returns), join the thread, free everything. NULL is a no-op. */
void cairn_service_stop(cairn_service *s);

/* Hand a request to the engine thread. Thread-safe; takes ownership of req
 * even on failure. CAIRN_ECLOSED after stop began. */
int cairn_service_submit(cairn_service *s, cairn_request *req);

/* The served model's vocabulary (the runtime's; immutable, any thread). */
const cairn_vocab *cairn_service_vocab(const cairn_service *s);
/* The served model's chat template (tokenizer.chat_template; the generic
 * format when the model has none). Immutable, owned by the service, valid
 * until stop; may be read from any thread, like the vocab. */
const cairn_chat_template *cairn_service_chat_template(const cairn_service *s);
const cairn_hparams *cairn_service_hparams(const cairn_service *s);
/* The runtime the service was started on. */
cairn_runtime *cairn_service_runtime(const cairn_service *s);
int cairn_service_page_size(const cairn_service *s);
/* The name of the KV type its pages are stored in ("f16", "q8_0", ...:
 * kernels/backend.h "KV types"); static storage. */
const char *cairn_service_kv_type(const cairn_service *s);
/* With a shared tier: publish this replica's "hello" (store.h, tier 3) with
 * its id and addresses. Any thread; CAIRN_OK and nothing without one. */
int cairn_service_announce(cairn_service *s, const char *replica, const char *http,
                           const char *rpc);
int cairn_service_n_ctx(const cairn_service *s);
/* The tiers' budgets as resolved at start: device KV, host RAM, disk. */
void cairn_service_tier_bytes(const cairn_service *s, size_t *kv, size_t *host, size_t *disk);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_SESSION_H */
