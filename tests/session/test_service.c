/*
 * tests/session/test_service.c — the engine thread and scheduler, driven
 * directly through session/session.h (no sockets): batching does not change
 * greedy results, prefixes are reused and reported, sessions fork and
 * truncate, a tiny KV budget forces pausing without deadlock or loss, and
 * cancellation finishes a request.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/support.h"

static const char *model_path;

static const char *greedy_text =
    ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw";

/* ---- collecting events ----------------------------------------------------- */

typedef struct {
    cairn_event ev;  /* copy; text/tokens point into the owned buffers below */
    char *text;
    int32_t *tokens;
    char *note;      /* a session's note (SESSION_INFO), copied */
    int n_deltas;
} result;

#define MAX_RESULTS 64

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    result res[MAX_RESULTS]; /* by request id */
    bool done[MAX_RESULTS];
    int delta_count[MAX_RESULTS];
    int finished_at[MAX_RESULTS]; /* order in which requests finished */
    int n_finished;
} collector;

static void on_event(const cairn_event *ev, void *user)
{
    collector *c = user;
    pthread_mutex_lock(&c->mu);
    if (ev->id < MAX_RESULTS) {
        if (ev->kind == CAIRN_EV_DELTA) {
            c->delta_count[ev->id]++;
        } else {
            result *r = &c->res[ev->id];
            r->ev = *ev;
            r->text = ev->text ? strndup(ev->text, ev->text_len) : NULL;
            r->tokens = NULL;
            if (ev->n_tokens) {
                r->tokens = malloc(ev->n_tokens * sizeof(int32_t));
                memcpy(r->tokens, ev->tokens, ev->n_tokens * sizeof(int32_t));
            }
            r->note = ev->note ? strndup(ev->note, ev->note_len) : NULL;
            r->ev.note = r->note;
            r->ev.text = r->text;
            r->ev.tokens = r->tokens;
            r->ev.message = NULL;
            c->done[ev->id] = true;
            c->finished_at[ev->id] = ++c->n_finished;
            pthread_cond_broadcast(&c->cv);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

static result *wait_for(collector *c, uint64_t id)
{
    pthread_mutex_lock(&c->mu);
    while (!c->done[id])
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    return &c->res[id];
}

static void collector_reset(collector *c)
{
    for (int i = 0; i < MAX_RESULTS; i++) {
        free(c->res[i].text);
        free(c->res[i].tokens);
        free(c->res[i].note);
    }
    memset(c->res, 0, sizeof c->res);
    memset(c->done, 0, sizeof c->done);
    memset(c->delta_count, 0, sizeof c->delta_count);
    memset(c->finished_at, 0, sizeof c->finished_at);
    c->n_finished = 0;
}

typedef struct {
    collector col;
    cairn_service *svc;
} fixture;

static fixture *start_tiers(size_t kv_pages, int max_seqs, int prefill_chunk, size_t host_pages,
                            const char *cache_dir)
{
    fixture *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->col.mu, NULL);
    pthread_cond_init(&f->col.cv, NULL);
    /* stories260K: 5 layers x 2 x 16 tokens x 4 heads x 8 dims x 2 bytes */
    size_t page_bytes = 5 * 2 * 16 * 4 * 8 * 2;
    cairn_service_config cfg = {
                                .kv_bytes = kv_pages * page_bytes, .page_size = 16,
                                .kv_type = CAIRN_TYPE_F16,
                                .host_bytes = host_pages * page_bytes, .cache_dir = cache_dir,
                                .disk_bytes = (size_t)64 << 20,
                                /* which tier serves a page must not depend on
                                 * timing here; the cost model has its own tests */
                                .load_policy = CAIRN_LOAD_ALWAYS,
                                .max_seqs = max_seqs, .prefill_chunk = prefill_chunk,
                                .on_event = on_event, .user = &f->col};
    char err[256] = "";
    int rc = support_service_start(model_path, 2, NULL, &cfg, &f->svc, err, sizeof err);
    if (rc != CAIRN_OK)
        fail_msg("service start: %s", err);
    return f;
}

static fixture *start(size_t kv_pages, int max_seqs, int prefill_chunk)
{
    return start_tiers(kv_pages, max_seqs, prefill_chunk, 0, NULL);
}

static void stop(fixture *f)
{
    support_service_stop(f->svc);
    collector_reset(&f->col);
    free(f);
}

static int32_t *tokenize(fixture *f, const char *text, bool bos, size_t *n)
{
    int32_t *ids = malloc(4096 * sizeof *ids);
    assert_int_equal(cairn_tokenize(cairn_service_vocab(f->svc), text, strlen(text),
                                    bos ? CAIRN_TOK_ADD_BOS : 0, ids, 4096, n),
                     CAIRN_OK);
    return ids;
}

static void submit_generate(fixture *f, uint64_t id, const char *prompt, int max_tokens,
                            bool stream)
{
    cairn_request *r = cairn_request_new(CAIRN_REQ_GENERATE);
    r->id = id;
    r->client = 1;
    r->tokens = tokenize(f, prompt, true, &r->n_tokens);
    r->gen.max_tokens = max_tokens;
    r->gen.sampling.temperature = 0;
    r->gen.stream = stream;
    assert_int_equal(cairn_service_submit(f->svc, r), CAIRN_OK);
}

/* ---- tests ------------------------------------------------------------------ */

static void test_greedy_matches_reference(void **state)
{
    (void)state;
    fixture *f = start(512, 8, 64);
    submit_generate(f, 1, "Once upon a time", 32, true);
    result *r = wait_for(&f->col, 1);
    assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
    assert_string_equal(r->text, greedy_text);
    assert_string_equal(r->ev.finish_reason, "length");
    assert_int_equal(r->ev.completion_tokens, 32);
    assert_int_equal(r->ev.prompt_tokens, 5);
    assert_true(f->col.delta_count[1] > 0);
    stop(f);
}

/* Many prompts at once give exactly what each gives alone. */
static void test_batching_does_not_change_results(void **state)
{
    (void)state;
    static const char *prompts[] = {"Once upon a time", "The little dog", "Lily and Tom went",
                                    "One day, a big bear", "She was very happy because",
                                    "Tim had a red ball. He", "The cat jumped", "Mom said"};
    const int n = 8;
    char *alone[8];
    fixture *f = start(512, 8, 7); /* small chunks: prompts interleave with decodes */
    for (int i = 0; i < n; i++) {
        submit_generate(f, (uint64_t)i + 1, prompts[i], 40, false);
        alone[i] = strdup(wait_for(&f->col, (uint64_t)i + 1)->text);
    }
    collector_reset(&f->col);
    for (int i = 0; i < n; i++)
        submit_generate(f, (uint64_t)i + 1, prompts[i], 40, i % 2 == 0);
    for (int i = 0; i < n; i++) {
        result *r = wait_for(&f->col, (uint64_t)i + 1);
        assert_string_equal(r->text, alone[i]);
        free(alone[i]);
    }
    stop(f);
}

/* ---- a prefix computed once --------------------------------------------- */

static cairn_session_id open_session(fixture *f, uint64_t id, const char *text);

static const char *burst_doc =
    "Once upon a time, in a small town by the sea, there lived a girl named Lily. Every "
    "morning she walked to the beach with her dog Max to look for shells. One day they "
    "found a big blue shell that sang when the wind blew. Lily took it home and put it "
    "on her window. At night the shell sang softly and all the birds came to listen. "
    "Her mom said it was the best shell in the whole town, and her friend Tom wanted to "
    "hear it too. So Lily and Tom sat by the window and listened until the moon was high.";

static size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

/* Submit n greedy generations of prompts[] at once (client i+1 each: the
 * fair share admits them together), wait for all; the sum of computed
 * prompt tokens (prompt - cached) must stay within the floor: the longest
 * shared prefix once, each request's own suffix, and one page. Each output
 * must equal the same request run alone on a fresh service. */
static void check_fan_out(const char *const *prompts, int n, int prefill_chunk)
{
    fixture *f = start(1024, 8, prefill_chunk);
    size_t n_tok[16], shared = 0, own = 0;
    int32_t *tok[16];
    for (int i = 0; i < n; i++)
        tok[i] = tokenize(f, prompts[i], true, &n_tok[i]);
    for (int i = 0; i < n; i++) {
        size_t best = 0; /* the prefix i shares with any other request */
        for (int k = 0; k < n; k++)
            if (k != i) {
                size_t l = common_prefix(tok[i], n_tok[i], tok[k], n_tok[k]);
                best = l > best ? l : best;
            }
        shared = best > shared ? best : shared;
        own += n_tok[i] - (best < n_tok[i] ? best : n_tok[i] - 1);
    }
    for (int i = 0; i < n; i++) {
        cairn_request *r = cairn_request_new(CAIRN_REQ_GENERATE);
        r->id = (uint64_t)i + 1;
        r->client = (uint64_t)i + 1;
        r->tokens = tok[i];
        r->n_tokens = n_tok[i];
        r->gen.max_tokens = 12;
        r->gen.sampling.temperature = 0;
        assert_int_equal(cairn_service_submit(f->svc, r), CAIRN_OK);
    }
    int64_t computed = 0;
    char *text[16];
    for (int i = 0; i < n; i++) {
        result *r = wait_for(&f->col, (uint64_t)i + 1);
        assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
        computed += r->ev.prompt_tokens - r->ev.cached_tokens;
        text[i] = strdup(r->text);
    }
    const int64_t floor_tokens = (int64_t)(shared + own);
    if (computed > floor_tokens + 16)
        fail_msg("%d requests computed %lld prompt tokens; the floor is %lld "
                 "(shared prefix %zu once + own suffixes %zu) + one page",
                 n, (long long)computed, (long long)floor_tokens, shared, own);
    stop(f);
    for (int i = 0; i < n; i++) {
        fixture *g = start(1024, 8, prefill_chunk);
        submit_generate(g, 1, prompts[i], 12, false);
        assert_string_equal(wait_for(&g->col, 1)->text, text[i]);
        stop(g);
        free(text[i]);
    }
}

/* Eight questions about one cold document, sent at once: the document is
 * computed once (the others wait for its pages, then compute their own
 * question), in small and large prefill chunks. */
static void test_burst_computes_document_once(void **state)
{
    (void)state;
    static const char *questions[] = {"Who is Max?", "What did they find?", "Where is the shell?",
                                      "Who is Tom?", "What did mom say?", "When did it sing?",
                                      "Why did the birds come?", "What color was the shell?"};
    char *prompts[8];
    for (int i = 0; i < 8; i++) {
        prompts[i] = malloc(strlen(burst_doc) + 64);
        sprintf(prompts[i], "%s\nQuestion: %s\nAnswer:", burst_doc, questions[i]);
    }
    check_fan_out((const char *const *)prompts, 8, 32);
    check_fan_out((const char *const *)prompts, 8, 512);
    for (int i = 0; i < 8; i++)
        free(prompts[i]);
}

/* n = 4 choices of one prompt are four requests of the same tokens at
 * once: the prompt is computed once, the others compute their last token. */
static void test_same_prompt_four_times(void **state)
{
    (void)state;
    const char *p[4] = {burst_doc, burst_doc, burst_doc, burst_doc};
    check_fan_out(p, 4, 64);
}

/* Eight sessions forked from one whose history was never computed, all
 * generating at once: the history is computed once. */
static void test_forked_sessions_share_history(void **state)
{
    (void)state;
    fixture *f = start(1024, 8, 32);
    cairn_session_id parent = open_session(f, 1, burst_doc);
    cairn_session_id kids[8];
    for (int i = 0; i < 8; i++) {
        cairn_request *fk = cairn_request_new(CAIRN_REQ_SESSION_FORK);
        fk->id = 2 + (uint64_t)i;
        fk->session = parent;
        cairn_service_submit(f->svc, fk); /* takes fk */
        kids[i] = wait_for(&f->col, 2 + (uint64_t)i)->ev.session;
    }
    static const char *turns[] = {" Max", " Tom", " The", " Lily", " Mom", " A", " Then", " One"};
    for (int i = 0; i < 8; i++) {
        cairn_request *r = cairn_request_new(CAIRN_REQ_SESSION_GENERATE);
        r->id = 20 + (uint64_t)i;
        r->client = 1 + (uint64_t)i;
        r->session = kids[i];
        r->tokens = tokenize(f, turns[i], false, &r->n_tokens);
        r->gen.max_tokens = 8;
        r->gen.sampling.temperature = 0;
        cairn_service_submit(f->svc, r);
    }
    size_t n_hist;
    free(tokenize(f, burst_doc, true, &n_hist));
    int64_t computed = 0;
    for (int i = 0; i < 8; i++) {
        result *r = wait_for(&f->col, 20 + (uint64_t)i);
        assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
        computed += r->ev.prompt_tokens - r->ev.cached_tokens;
    }
    /* the history once, each turn's token(s), one page */
    if (computed > (int64_t)n_hist + 8 * 2 + 16)
        fail_msg("8 forks computed %lld prompt tokens over a %zu-token history",
                 (long long)computed, n_hist);
    stop(f);
}

/* A second request with the same long prefix reports it cached, and gives
 * the same output as without the cache. */
static void test_prefix_reuse(void **state)
{
    (void)state;
    fixture *f = start(512, 4, 256);
    const char *doc = "Once upon a time, there was a small dog named Max. Max lived in a red "
                      "house with a big garden. Every morning, Max ran to the fence to see the "
                      "birds. The birds sang songs and Max wagged his tail. One day";
    submit_generate(f, 1, doc, 16, false);
    result *a = wait_for(&f->col, 1);
    assert_int_equal(a->ev.cached_tokens, 0);
    submit_generate(f, 2, doc, 16, false);
    result *b = wait_for(&f->col, 2);
    /* every token but the last, whose logits are needed: the whole pages
     * by match, the rest of the last page copied from the cached one */
    int64_t n = b->ev.prompt_tokens;
    assert_int_equal(b->ev.cached_tokens, n - 1);
    assert_string_equal(a->text, b->text);

    cairn_request *st = cairn_request_new(CAIRN_REQ_CACHE_STATS);
    st->id = 3;
    cairn_service_submit(f->svc, st);
    result *s = wait_for(&f->col, 3);
    assert_int_equal(s->ev.stats.queries, 2);
    assert_int_equal(s->ev.stats.cached_tokens, (uint64_t)b->ev.cached_tokens);
    assert_true(s->ev.stats.pages[0] > 0);
    assert_int_equal(s->ev.stats.running, 0);
    stop(f);
}

static cairn_session_id open_session(fixture *f, uint64_t id, const char *text)
{
    cairn_request *r = cairn_request_new(CAIRN_REQ_SESSION_OPEN);
    r->id = id;
    r->tokens = tokenize(f, text, true, &r->n_tokens);
    cairn_service_submit(f->svc, r);
    result *res = wait_for(&f->col, id);
    assert_int_equal(res->ev.kind, CAIRN_EV_DONE);
    return res->ev.session;
}

static result *session_generate(fixture *f, uint64_t id, cairn_session_id sid, const char *text,
                                int max_tokens)
{
    cairn_request *r = cairn_request_new(CAIRN_REQ_SESSION_GENERATE);
    r->id = id;
    r->session = sid;
    if (text)
        r->tokens = tokenize(f, text, false, &r->n_tokens);
    r->gen.max_tokens = max_tokens;
    r->gen.sampling.temperature = 0;
    cairn_service_submit(f->svc, r);
    return wait_for(&f->col, id);
}

static void test_sessions(void **state)
{
    (void)state;
    fixture *f = start(512, 4, 64);
    cairn_session_id sid = open_session(f, 1, "Once upon a time");
    result *t1 = session_generate(f, 2, sid, NULL, 32);
    assert_string_equal(t1->text, greedy_text);
    /* turn 2: the history (prompt + reply, 37 tokens) is cached to the
     * token: all of it but the reply's last token, which was sampled and
     * never computed (the partial last page is a tail) */
    result *t2 = session_generate(f, 3, sid, " Then", 8);
    assert_true(t2->ev.prompt_tokens > 37);
    assert_int_equal(t2->ev.cached_tokens, 36);

    /* fork: the child continues exactly as the parent would */
    cairn_request *fk = cairn_request_new(CAIRN_REQ_SESSION_FORK);
    fk->id = 4;
    fk->session = sid;
    cairn_service_submit(f->svc, fk);
    result *child = wait_for(&f->col, 4);
    assert_int_equal(child->ev.kind, CAIRN_EV_DONE);
    assert_false(child->ev.session.hi == sid.hi && child->ev.session.lo == sid.lo);
    cairn_session_id cid = child->ev.session;
    result *pc = session_generate(f, 5, sid, " She", 12);
    result *cc = session_generate(f, 6, cid, " She", 12);
    assert_string_equal(pc->text, cc->text);
    assert_true(cc->ev.cached_tokens > 0); /* the fork found the parent's pages */

    /* truncate back to the first prompt: generation repeats turn 1 */
    cairn_request *tr = cairn_request_new(CAIRN_REQ_SESSION_TRUNCATE);
    tr->id = 7;
    tr->session = cid;
    tr->n_keep = 5;
    cairn_service_submit(f->svc, tr);
    assert_int_equal(wait_for(&f->col, 7)->ev.n_session_tokens, 5);
    result *again = session_generate(f, 8, cid, NULL, 32);
    assert_string_equal(again->text, greedy_text);
    /* 4 matchable tokens, less than a page: copied from the cached page */
    assert_int_equal(again->ev.cached_tokens, 4);

    /* unknown session */
    cairn_request *bad = cairn_request_new(CAIRN_REQ_SESSION_INFO);
    bad->id = 9;
    bad->session = (cairn_session_id){1, 2};
    cairn_service_submit(f->svc, bad);
    result *e = wait_for(&f->col, 9);
    assert_int_equal(e->ev.kind, CAIRN_EV_ERROR);
    assert_int_equal(e->ev.code, CAIRN_ENOTFOUND);

    /* close, then it is gone */
    cairn_request *cl = cairn_request_new(CAIRN_REQ_SESSION_CLOSE);
    cl->id = 10;
    cl->session = sid;
    cairn_service_submit(f->svc, cl);
    assert_int_equal(wait_for(&f->col, 10)->ev.kind, CAIRN_EV_DONE);
    cairn_request *info = cairn_request_new(CAIRN_REQ_SESSION_INFO);
    info->id = 11;
    info->session = sid;
    cairn_service_submit(f->svc, info);
    assert_int_equal(wait_for(&f->col, 11)->ev.kind, CAIRN_EV_ERROR);
    stop(f);
}

/* With KV for barely more than one request, eight requests still all finish
 * with the output they give alone: pages are evicted and requests paused, and
 * nothing deadlocks or is dropped. */
static void test_tiny_kv_pauses_not_fails(void **state)
{
    (void)state;
    static const char *prompts[] = {"Once upon a time", "The little dog", "Lily and Tom went",
                                    "One day, a big bear", "She was very happy because",
                                    "Tim had a red ball. He", "The cat jumped", "Mom said"};
    char *alone[8];
    fixture *big = start(512, 8, 64);
    for (int i = 0; i < 8; i++) {
        submit_generate(big, (uint64_t)i + 1, prompts[i], 60, false);
        alone[i] = strdup(wait_for(&big->col, (uint64_t)i + 1)->text);
    }
    stop(big);

    fixture *f = start(6, 8, 64); /* 6 pages = 96 tokens for everyone */
    for (int i = 0; i < 8; i++)
        submit_generate(f, (uint64_t)i + 1, prompts[i], 60, false);
    for (int i = 0; i < 8; i++) {
        result *r = wait_for(&f->col, (uint64_t)i + 1);
        assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
        assert_string_equal(r->text, alone[i]);
        free(alone[i]);
    }
    cairn_request *st = cairn_request_new(CAIRN_REQ_CACHE_STATS);
    st->id = 20;
    cairn_service_submit(f->svc, st);
    result *s = wait_for(&f->col, 20);
    assert_true(s->ev.stats.paused > 0);
    assert_int_equal(s->ev.stats.running + s->ev.stats.waiting, 0);

    /* a request that can never fit fails with an error instead of waiting */
    submit_generate(f, 21, "Once upon a time", 200, false);
    result *big_req = wait_for(&f->col, 21);
    assert_int_equal(big_req->ev.kind, CAIRN_EV_ERROR);
    stop(f);
}

static void test_cancel(void **state)
{
    (void)state;
    fixture *f = start(512, 4, 64);
    submit_generate(f, 1, "Once upon a time", 1000, true);
    cairn_request *c = cairn_request_new(CAIRN_REQ_CANCEL);
    c->id = 2;
    c->client = 1;
    c->target = 1;
    cairn_service_submit(f->svc, c);
    result *cr = wait_for(&f->col, 2);
    assert_true(cr->ev.found);
    result *r = wait_for(&f->col, 1);
    assert_string_equal(r->ev.finish_reason, "cancelled");
    assert_true(r->ev.completion_tokens < 1000);
    /* cancel of an unknown request */
    c = cairn_request_new(CAIRN_REQ_CANCEL);
    c->id = 3;
    c->client = 1;
    c->target = 99;
    cairn_service_submit(f->svc, c);
    assert_false(wait_for(&f->col, 3)->ev.found);
    stop(f);
}

static void test_stop_strings_and_errors(void **state)
{
    (void)state;
    fixture *f = start(512, 4, 64);
    cairn_request *r = cairn_request_new(CAIRN_REQ_GENERATE);
    r->id = 1;
    r->tokens = tokenize(f, "Once upon a time", true, &r->n_tokens);
    r->gen.max_tokens = 32;
    r->gen.sampling.temperature = 0;
    r->gen.stream = true;
    r->gen.n_stop = 1;
    r->gen.stop[0] = strdup(" Lily");
    cairn_service_submit(f->svc, r);
    result *res = wait_for(&f->col, 1);
    assert_string_equal(res->text, ", there was a little girl named");
    assert_string_equal(res->ev.finish_reason, "stop");

    /* empty prompt */
    r = cairn_request_new(CAIRN_REQ_GENERATE);
    r->id = 2;
    cairn_service_submit(f->svc, r);
    assert_int_equal(wait_for(&f->col, 2)->ev.kind, CAIRN_EV_ERROR);
    /* prompt longer than the context */
    r = cairn_request_new(CAIRN_REQ_GENERATE);
    r->id = 3;
    r->n_tokens = 3000;
    r->tokens = calloc(3000, sizeof(int32_t));
    cairn_service_submit(f->svc, r);
    result *e = wait_for(&f->col, 3);
    assert_int_equal(e->ev.kind, CAIRN_EV_ERROR);
    assert_int_equal(e->ev.code, CAIRN_ERANGE);
    stop(f);
}

static const char *long_doc =
    "Once upon a time, there was a small dog named Max. Max lived in a red house with a big "
    "garden. Every morning, Max ran to the fence to see the birds. The birds sang songs and Max "
    "wagged his tail. One day, Max saw a ball under the tree. It was a blue ball with yellow "
    "stars. Max wanted to play with it, but the ball was stuck in the mud. He pulled and pulled. "
    "The ball did not move. Max felt sad. Then a little girl named Sue came to the garden. She "
    "saw Max and smiled. Do you need help, she asked. Max barked and looked at the ball.";

static void rm_rf(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* A graceful stop writes everything back; after a restart over the same
 * cache directory the prompt is served from disk with the same output, and
 * sessions are still there. */
static void test_restart_serves_from_disk(void **state)
{
    (void)state;
    char dir[] = "/tmp/cairn-svc-XXXXXX";
    assert_non_null(mkdtemp(dir));
    fixture *f = start_tiers(512, 4, 64, 64, dir);
    submit_generate(f, 1, long_doc, 24, false);
    char *first = strdup(wait_for(&f->col, 1)->text);
    cairn_session_id sid = open_session(f, 2, "Once upon a time");
    result *turn = session_generate(f, 3, sid, NULL, 32);
    assert_string_equal(turn->text, greedy_text);
    stop(f);

    f = start_tiers(512, 4, 64, 64, dir);
    submit_generate(f, 1, long_doc, 24, false);
    result *r = wait_for(&f->col, 1);
    assert_string_equal(r->text, first);
    assert_true(r->ev.cached_tokens * 5 >= r->ev.prompt_tokens * 4); /* >= 80% */
    assert_int_equal(r->ev.cached_by_tier[2], r->ev.cached_tokens);  /* all from disk */

    /* the session survived the graceful restart and continues identically */
    cairn_request *info = cairn_request_new(CAIRN_REQ_SESSION_INFO);
    info->id = 4;
    info->session = sid;
    cairn_service_submit(f->svc, info);
    result *in = wait_for(&f->col, 4);
    assert_int_equal(in->ev.kind, CAIRN_EV_DONE);
    assert_int_equal(in->ev.n_session_tokens, 5 + 32);
    result *t2 = session_generate(f, 5, sid, " She", 8);
    assert_true(t2->ev.cached_by_tier[2] >= 32);
    stop(f);
    free(first);

    /* another page size never reads those entries */
    cairn_service_config cfg = { .page_size = 8,
                                .kv_type = CAIRN_TYPE_F16, .cache_dir = dir,
                                .disk_bytes = (size_t)64 << 20, .max_seqs = 4};
    collector col = {0};
    pthread_mutex_init(&col.mu, NULL);
    pthread_cond_init(&col.cv, NULL);
    cfg.on_event = on_event;
    cfg.user = &col;
    cairn_service *svc;
    char err[256];
    assert_int_equal(support_service_start(model_path, 2, NULL, &cfg, &svc, err, sizeof err), CAIRN_OK);
    fixture tmp = {.svc = svc};
    cairn_request *g = cairn_request_new(CAIRN_REQ_GENERATE);
    g->id = 1;
    g->tokens = tokenize(&tmp, long_doc, true, &g->n_tokens);
    g->gen.max_tokens = 4;
    g->gen.sampling.temperature = 0;
    cairn_service_submit(svc, g);
    assert_int_equal(wait_for(&col, 1)->ev.cached_tokens, 0);
    support_service_stop(svc);
    collector_reset(&col);
    rm_rf(dir);
}

/* With room for about two sessions in tier 0, two dozen sessions each take
 * a turn; then each takes a second turn, finds its history in host RAM or on
 * disk, and says so — and the output equals a server with plenty of memory. */
static void test_many_sessions_resume_from_lower_tiers(void **state)
{
    (void)state;
    static const char *starts[] = {"Once upon a time", "The little dog", "Lily and Tom went",
                                   "One day, a big bear", "She was very happy", "Tim had a ball",
                                   "The cat jumped", "Mom said"};
    enum { N = 24 };
    char *want[N];
    cairn_session_id sids[N];
    fixture *big = start(1024, 8, 64);
    for (int i = 0; i < N; i++) {
        cairn_session_id sid = open_session(big, 1, starts[i % 8]);
        session_generate(big, 2, sid, i < 8 ? NULL : " Then", 20 + i % 5);
        want[i] = strdup(session_generate(big, 3, sid, " The", 6)->text);
        collector_reset(&big->col);
    }
    stop(big);

    char dir[] = "/tmp/cairn-svc-XXXXXX";
    assert_non_null(mkdtemp(dir));
    fixture *f = start_tiers(6, 4, 64, 16, dir); /* 6 device pages, 16 host slots */
    for (int i = 0; i < N; i++) {
        sids[i] = open_session(f, 1, starts[i % 8]);
        result *t1 = session_generate(f, 2, sids[i], i < 8 ? NULL : " Then", 20 + i % 5);
        assert_int_equal(t1->ev.kind, CAIRN_EV_DONE);
        collector_reset(&f->col);
    }
    int from_lower = 0;
    for (int i = 0; i < N; i++) {
        result *t2 = session_generate(f, 3, sids[i], " The", 6);
        assert_int_equal(t2->ev.kind, CAIRN_EV_DONE);
        assert_string_equal(t2->text, want[i]);
        if (t2->ev.cached_tokens < 16) /* the history, in whole pages */
            fail_msg("session %d: prompt %lld, cached %lld (device %lld host %lld disk %lld)", i,
                     (long long)t2->ev.prompt_tokens, (long long)t2->ev.cached_tokens,
                     (long long)t2->ev.cached_by_tier[0], (long long)t2->ev.cached_by_tier[1],
                     (long long)t2->ev.cached_by_tier[2]);
        assert_int_equal(t2->ev.cached_by_tier[0] + t2->ev.cached_by_tier[1] +
                             t2->ev.cached_by_tier[2],
                         t2->ev.cached_tokens);
        from_lower += t2->ev.cached_by_tier[1] + t2->ev.cached_by_tier[2] > 0;
        free(want[i]);
        collector_reset(&f->col);
    }
    /* all but the few most recent sessions had left tier 0 */
    assert_true(from_lower >= N - 4);
    stop(f);
    rm_rf(dir);
}

/* Tenants share nothing: not sessions, not cached prefixes. */
static void test_tenants_are_isolated(void **state)
{
    (void)state;
    fixture *f = start(512, 4, 64);
    const uint64_t alice = 0x1111, bob = 0x2222;
    for (int k = 0; k < 3; k++) {
        cairn_request *r = cairn_request_new(CAIRN_REQ_GENERATE);
        r->id = (uint64_t)k + 1;
        r->tenant = k < 2 ? alice : bob;
        r->tokens = tokenize(f, long_doc, true, &r->n_tokens);
        r->gen.max_tokens = 8;
        r->gen.sampling.temperature = 0;
        cairn_service_submit(f->svc, r);
        wait_for(&f->col, (uint64_t)k + 1);
    }
    result *a1 = &f->col.res[1], *a2 = &f->col.res[2], *b1 = &f->col.res[3];
    assert_int_equal(a1->ev.cached_tokens, 0);
    assert_true(a2->ev.cached_tokens > 0);      /* alice reuses her own prefix */
    assert_int_equal(b1->ev.cached_tokens, 0);  /* bob does not see alice's */
    assert_string_equal(a1->text, b1->text);    /* and computes the same answer */

    /* alice's session is invisible to bob */
    cairn_request *o = cairn_request_new(CAIRN_REQ_SESSION_OPEN);
    o->id = 4;
    o->tenant = alice;
    o->tokens = tokenize(f, "Once upon a time", true, &o->n_tokens);
    cairn_service_submit(f->svc, o);
    cairn_session_id sid = wait_for(&f->col, 4)->ev.session;
    cairn_request *i = cairn_request_new(CAIRN_REQ_SESSION_INFO);
    i->id = 5;
    i->tenant = bob;
    i->session = sid;
    cairn_service_submit(f->svc, i);
    result *r = wait_for(&f->col, 5);
    assert_int_equal(r->ev.kind, CAIRN_EV_ERROR);
    assert_int_equal(r->ev.code, CAIRN_ENOTFOUND);
    i = cairn_request_new(CAIRN_REQ_SESSION_INFO);
    i->id = 6;
    i->tenant = alice;
    i->session = sid;
    cairn_service_submit(f->svc, i);
    assert_int_equal(wait_for(&f->col, 6)->ev.kind, CAIRN_EV_DONE);
    stop(f);
}

/* Retention hints (session.h, "Retention"): a pinned prefix stays cached
 * through a flood that evicts everything else, a pin past the tenant's
 * bound is refused with CAIRN_EQUOTA before anything runs, and pinning the
 * same prefix again refreshes it without counting it twice. */
static uint64_t pins_submit(fixture *f, uint64_t id, uint64_t tenant, int seed, size_t n,
                            size_t pin_tokens, double ttl_s)
{
    cairn_request *r = cairn_request_new(CAIRN_REQ_GENERATE);
    r->id = id;
    r->client = 1;
    r->tenant = tenant;
    r->tokens = malloc(n * sizeof *r->tokens);
    for (size_t i = 0; i < n; i++) /* distinct from the first token on, per seed */
        r->tokens[i] = (int32_t)(3 + ((size_t)seed * 131 + i * 17 + i * i * (size_t)seed) % 480);
    r->n_tokens = n;
    r->gen.max_tokens = 1;
    r->gen.sampling.temperature = 0;
    if (ttl_s > 0) {
        r->n_pins = 1;
        r->pins[0].tokens = pin_tokens;
        r->pins[0].ttl_s = ttl_s;
    }
    assert_int_equal(cairn_service_submit(f->svc, r), CAIRN_OK);
    return id;
}

static cairn_service_stats pins_stats_now(fixture *f, uint64_t id)
{
    cairn_request *st = cairn_request_new(CAIRN_REQ_CACHE_STATS);
    st->id = id;
    cairn_service_submit(f->svc, st);
    return wait_for(&f->col, id)->ev.stats;
}

static void test_pins_hold_through_eviction(void **state)
{
    (void)state;
    /* 24 pages (384 tokens), no host tier: a tenant may pin 96 tokens */
    fixture *f = start(24, 4, 64);
    const uint64_t alice = 0xa11ce;
    result *r = wait_for(&f->col, pins_submit(f, 1, alice, 1, 90, 70, 600));
    assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
    cairn_service_stats st = pins_stats_now(f, 2);
    assert_int_equal(st.pinned_tokens, 64); /* 70 tokens, whole pages */
    assert_int_equal(st.pinned_prefixes, 1);

    /* 10 one-off prompts of 5 pages: twice what the pool holds */
    for (int k = 0; k < 10; k++)
        assert_int_equal(wait_for(&f->col, pins_submit(f, 10 + (uint64_t)k, alice, 100 + k, 80,
                                                       0, 0))->ev.kind, CAIRN_EV_DONE);
    assert_true(pins_stats_now(f, 3).evicted_pages > 0);
    r = wait_for(&f->col, pins_submit(f, 4, alice, 100, 80, 0, 0));
    assert_true(r->ev.cached_tokens < 16); /* the first one-off is gone ... */
    r = wait_for(&f->col, pins_submit(f, 5, alice, 1, 90, 0, 0));
    assert_true(r->ev.cached_tokens >= 64); /* ... the pinned prefix is not */

    /* past the bound: refused before anything runs, nothing pinned */
    r = wait_for(&f->col, pins_submit(f, 6, alice, 2, 90, 48, 600));
    assert_int_equal(r->ev.kind, CAIRN_EV_ERROR);
    assert_int_equal(r->ev.code, CAIRN_EQUOTA);
    /* another tenant has a bound of its own */
    r = wait_for(&f->col, pins_submit(f, 7, 0xb0b, 2, 90, 48, 600));
    assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
    /* the same prefix again: refreshed, not counted twice */
    r = wait_for(&f->col, pins_submit(f, 8, alice, 1, 90, 70, 600));
    assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
    st = pins_stats_now(f, 9);
    assert_int_equal(st.pinned_tokens, 64 + 48);
    assert_int_equal(st.pinned_prefixes, 2);
    assert_int_equal(st.pins_refused, 1);
    stop(f);
}

/* One connection with many queued requests does not starve another: the
 * second client's request is admitted at the first free slot. */
static void test_fair_between_clients(void **state)
{
    (void)state;
    fixture *f = start(512, 4, 64);
    for (int i = 1; i <= 24; i++) {
        cairn_request *r = cairn_request_new(CAIRN_REQ_GENERATE);
        r->id = (uint64_t)i;
        r->client = 1;
        r->tokens = tokenize(f, "Once upon a time", true, &r->n_tokens);
        r->gen.max_tokens = 48;
        r->gen.sampling.temperature = 0;
        cairn_service_submit(f->svc, r);
    }
    submit_generate(f, 25, "The little dog", 4, false); /* client 1 as well... */
    cairn_request *b = cairn_request_new(CAIRN_REQ_GENERATE);
    b->id = 26;
    b->client = 2; /* ...and a bystander on another connection */
    b->tokens = tokenize(f, "The little dog", true, &b->n_tokens);
    b->gen.max_tokens = 4;
    b->gen.sampling.temperature = 0;
    cairn_service_submit(f->svc, b);
    for (int i = 1; i <= 26; i++)
        wait_for(&f->col, (uint64_t)i);
    /* FIFO would finish it last; a fair share lets it in with the first
     * slot that frees up, so at most the first wave of client 1 is ahead. */
    assert_true(f->col.finished_at[26] <= 8);
    assert_string_equal(f->col.res[26].text, f->col.res[25].text);
    stop(f);
}

/* A named session brought to whole prompts (what the HTTP facade sends):
 * a resent conversation reuses the session's history (only the new part is
 * computed), a changed one is cut where it parts, a second request while
 * one runs is refused, and the text equals a plain generation's. */
static cairn_request *sync_request(fixture *f, uint64_t id, const char *key, const char *prompt,
                                   int max_tokens)
{
    cairn_request *r = cairn_request_new(CAIRN_REQ_SESSION_SYNC);
    r->id = id;
    r->client = 1;
    r->session_key = strdup(key);
    r->session_key_len = strlen(key);
    r->tokens = tokenize(f, prompt, true, &r->n_tokens);
    r->gen.max_tokens = max_tokens;
    r->gen.sampling.temperature = 0;
    return r;
}

static result *session_call(fixture *f, uint64_t id, cairn_req_kind kind, cairn_session_id sid,
                            const char *note)
{
    cairn_request *r = cairn_request_new(kind);
    r->id = id;
    r->session = sid;
    if (note) {
        r->note = strdup(note);
        r->note_len = strlen(note);
    }
    cairn_service_submit(f->svc, r);
    return wait_for(&f->col, id);
}

/* A session's note (what HTTP's Responses API keeps with a stored
 * response): set, read back by info, not inherited by a fork, refused when
 * too large, kept in the record across a restart (record version 4), and
 * cleared again. */
static void test_session_note(void **state)
{
    (void)state;
    char dir[] = "/tmp/cairn-svc-note-XXXXXX";
    assert_non_null(mkdtemp(dir));
    fixture *f = start_tiers(512, 4, 64, 64, dir);
    cairn_session_id sid = open_session(f, 1, "Once upon a time");
    assert_null(session_call(f, 2, CAIRN_REQ_SESSION_INFO, sid, NULL)->ev.note);
    assert_int_equal(session_call(f, 3, CAIRN_REQ_SESSION_NOTE, sid, "{\"id\": 1}")->ev.kind,
                     CAIRN_EV_DONE);
    result *in = session_call(f, 4, CAIRN_REQ_SESSION_INFO, sid, NULL);
    assert_string_equal(in->ev.note, "{\"id\": 1}");
    assert_int_equal(in->ev.note_len, 9);
    assert_int_equal(in->ev.n_session_tokens, 5);
    result *fk = session_call(f, 5, CAIRN_REQ_SESSION_FORK, sid, NULL);
    assert_int_equal(fk->ev.kind, CAIRN_EV_DONE);
    assert_null(session_call(f, 6, CAIRN_REQ_SESSION_INFO, fk->ev.session, NULL)->ev.note);
    /* too large: refused, the note stays */
    cairn_request *big = cairn_request_new(CAIRN_REQ_SESSION_NOTE);
    big->id = 7;
    big->session = sid;
    big->note_len = CAIRN_SESSION_NOTE_MAX + 1;
    big->note = calloc(1, big->note_len);
    cairn_service_submit(f->svc, big);
    assert_int_equal(wait_for(&f->col, 7)->ev.code, CAIRN_ERANGE);
    /* an unknown session has no note to set */
    assert_int_equal(session_call(f, 8, CAIRN_REQ_SESSION_NOTE, (cairn_session_id){1, 2}, "x")
                         ->ev.code,
                     CAIRN_ENOTFOUND);
    /* the session goes on generating: the note is not touched */
    assert_string_equal(session_generate(f, 9, sid, NULL, 32)->text, greedy_text);
    stop(f);

    f = start_tiers(512, 4, 64, 64, dir);
    in = session_call(f, 1, CAIRN_REQ_SESSION_INFO, sid, NULL);
    assert_int_equal(in->ev.kind, CAIRN_EV_DONE);
    assert_string_equal(in->ev.note, "{\"id\": 1}");
    assert_int_equal(in->ev.n_session_tokens, 5 + 32);
    /* an empty note clears it, and the record without one reads back so */
    assert_int_equal(session_call(f, 2, CAIRN_REQ_SESSION_NOTE, sid, "")->ev.kind, CAIRN_EV_DONE);
    assert_null(session_call(f, 3, CAIRN_REQ_SESSION_INFO, sid, NULL)->ev.note);
    stop(f);
    f = start_tiers(512, 4, 64, 64, dir);
    in = session_call(f, 1, CAIRN_REQ_SESSION_INFO, sid, NULL);
    assert_int_equal(in->ev.n_session_tokens, 5 + 32);
    assert_null(in->ev.note);
    stop(f);
    rm_rf(dir);
}

/* A service over `dir` with these bounds on sessions and stored responses. */
static fixture *start_bounded(const char *dir, size_t max_sessions, size_t max_responses,
                              double response_ttl_s)
{
    fixture *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->col.mu, NULL);
    pthread_cond_init(&f->col.cv, NULL);
    cairn_service_config cfg = {.kv_bytes = (size_t)512 * 5 * 2 * 16 * 4 * 8 * 2,
                                .page_size = 16, .kv_type = CAIRN_TYPE_F16, .cache_dir = dir,
                                .disk_bytes = (size_t)64 << 20, .max_seqs = 4,
                                .max_sessions = max_sessions, .max_responses = max_responses,
                                .response_ttl_s = response_ttl_s, .on_event = on_event,
                                .user = &f->col};
    char err[256] = "";
    if (support_service_start(model_path, 2, NULL, &cfg, &f->svc, err, sizeof err) != CAIRN_OK)
        fail_msg("service start: %s", err);
    return f;
}

/* A stored response (HTTP's Responses API) opened or forked with
 * `response`, or a user's session (persisted, so that only a bound or a TTL
 * can take it away). */
static result *open_kind(fixture *f, uint64_t id, bool response)
{
    cairn_request *r = cairn_request_new(CAIRN_REQ_SESSION_OPEN);
    r->id = id;
    r->response = response;
    r->persist = true;
    r->tokens = tokenize(f, "Once upon a time", true, &r->n_tokens);
    cairn_service_submit(f->svc, r);
    return wait_for(&f->col, id);
}

static bool exists(fixture *f, uint64_t id, cairn_session_id sid)
{
    return session_call(f, id, CAIRN_REQ_SESSION_INFO, sid, NULL)->ev.kind == CAIRN_EV_DONE;
}

/* Stored responses are not open sessions: they do not count toward
 * max_sessions; beyond max_responses the least recently continued goes;
 * they expire response_ttl_s after they were made, the TTL in force then
 * (across a restart too); a user's session is never taken by either. */
static void test_stored_responses(void **state)
{
    (void)state;
    char dir[] = "/tmp/cairn-svc-resp-XXXXXX";
    assert_non_null(mkdtemp(dir));
    fixture *f = start_bounded(dir, 2, 3, 3600);
    cairn_session_id user[2], resp[4];
    for (int i = 0; i < 2; i++)
        user[i] = open_kind(f, 1 + (uint64_t)i, false)->ev.session;
    assert_int_equal(open_kind(f, 3, false)->ev.code, CAIRN_EFULL); /* max_sessions is full */
    for (int i = 0; i < 3; i++) { /* ... and responses are not refused for it */
        result *r = open_kind(f, 4 + (uint64_t)i, true);
        assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
        resp[i] = r->ev.session;
    }
    /* resp[0] continued: the fourth pushes out resp[1], least recently continued */
    cairn_request *fk = cairn_request_new(CAIRN_REQ_SESSION_FORK);
    fk->id = 7;
    fk->session = resp[0];
    fk->response = true;
    cairn_service_submit(f->svc, fk);
    result *r = wait_for(&f->col, 7);
    assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
    resp[3] = r->ev.session;
    assert_false(exists(f, 8, resp[1]));
    assert_true(exists(f, 9, resp[0]) && exists(f, 10, resp[2]) && exists(f, 11, resp[3]));
    assert_true(exists(f, 12, user[0]) && exists(f, 13, user[1]));
    stop(f);

    /* after a graceful restart with room for two: two of the three come
     * back (the oldest goes; all were made in the same second here), the
     * users' sessions all do, and max_sessions still counts only theirs */
    f = start_bounded(dir, 2, 2, 3600);
    int back = exists(f, 1, resp[0]) + exists(f, 2, resp[2]) + exists(f, 3, resp[3]);
    assert_int_equal(back, 2);
    assert_false(exists(f, 4, resp[1]));
    assert_true(exists(f, 5, user[0]) && exists(f, 6, user[1]));
    assert_int_equal(open_kind(f, 7, false)->ev.code, CAIRN_EFULL);
    stop(f);

    /* the deadline is fixed when a response is made and kept in its
     * record: made under an hour, they outlive a restart under 2 s (a
     * record is never deleted for how the server was started) */
    sleep(3);
    f = start_bounded(dir, 2, 2, 2);
    back = exists(f, 1, resp[0]) + exists(f, 2, resp[2]) + exists(f, 3, resp[3]);
    assert_int_equal(back, 2);
    assert_true(exists(f, 4, user[0]) && exists(f, 5, user[1]));
    /* and while the service runs: a new one is there, then is not */
    r = open_kind(f, 6, true);
    assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
    cairn_session_id fresh = r->ev.session;
    assert_true(exists(f, 7, fresh));
    /* one whose object was never stored (no note: its client left) is
     * given a minute past its deadline; a stored one is not */
    r = open_kind(f, 11, true);
    assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
    cairn_session_id unstored = r->ev.session;
    assert_int_equal(session_call(f, 12, CAIRN_REQ_SESSION_NOTE, fresh, "{\"object\":\"response\"}")
                         ->ev.kind,
                     CAIRN_EV_DONE);
    sleep(3);
    assert_false(exists(f, 8, fresh));
    assert_true(exists(f, 13, unstored));
    assert_true(exists(f, 9, user[0]) && exists(f, 10, user[1]));
    stop(f);
    rm_rf(dir);
}

/* A stored response written before record version 5 (a plain session with
 * a note, no name) is taken as one at start: it stops counting toward
 * max_sessions, and is written again as version 5, so its TTL runs on
 * across restarts. */
static void test_legacy_response_records(void **state)
{
    (void)state;
    char dir[] = "/tmp/cairn-svc-legacy-XXXXXX";
    assert_non_null(mkdtemp(dir));
    fixture *f = start_bounded(dir, 3, 8, 3600);
    cairn_session_id user[2];
    for (int i = 0; i < 2; i++)
        user[i] = open_kind(f, 1 + (uint64_t)i, false)->ev.session;
    cairn_session_id old = open_kind(f, 3, false)->ev.session; /* as cairn wrote one before */
    assert_int_equal(session_call(f, 4, CAIRN_REQ_SESSION_NOTE, old, "{\"object\":\"response\"}")
                         ->ev.kind,
                     CAIRN_EV_DONE);
    stop(f);

    /* room for the users' two only; taken as a response made now, under
     * the TTL in force (2 s) */
    f = start_bounded(dir, 2, 8, 2);
    assert_true(exists(f, 1, user[0]) && exists(f, 2, user[1]) && exists(f, 3, old));
    assert_int_equal(open_kind(f, 4, false)->ev.code, CAIRN_EFULL);
    stop(f);
    sleep(3);
    f = start_bounded(dir, 2, 8, 3600); /* its deadline is on disk now */
    assert_false(exists(f, 1, old));
    assert_true(exists(f, 2, user[0]) && exists(f, 3, user[1]));
    stop(f);
    rm_rf(dir);
}

static void test_named_session_sync(void **state)
{
    (void)state;
    fixture *f = start(512, 4, 64);
    const char *turn1 = "Once upon a time, there was a little girl named Lily. She loved to";
    submit_generate(f, 1, turn1, 16, false);
    char *plain = strdup(wait_for(&f->col, 1)->text);
    assert_int_equal(cairn_service_submit(f->svc, sync_request(f, 2, "conv-a", turn1, 16)),
                     CAIRN_OK);
    result *r = wait_for(&f->col, 2);
    assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
    assert_string_equal(r->text, plain);
    /* the conversation resent with the reply and more: only that is new */
    char turn2[512];
    snprintf(turn2, sizeof turn2, "%s%s One day", turn1, plain);
    assert_int_equal(cairn_service_submit(f->svc, sync_request(f, 3, "conv-a", turn2, 8)),
                     CAIRN_OK);
    r = wait_for(&f->col, 3);
    assert_int_equal(r->ev.kind, CAIRN_EV_DONE);
    size_t n1 = 0, n2 = 0;
    free(tokenize(f, turn1, true, &n1));
    free(tokenize(f, turn2, true, &n2));
    /* at least the first turn's whole pages come from the session's history */
    assert_true(r->ev.cached_tokens >= (int64_t)(n1 / 16 * 16));
    assert_int_equal(r->ev.prompt_tokens, (int64_t)n2);
    /* a conversation that parts early: cut there, same text as plain */
    const char *other = "Once upon a time, there was a big dog";
    submit_generate(f, 4, other, 12, false);
    char *plain_other = strdup(wait_for(&f->col, 4)->text);
    assert_int_equal(cairn_service_submit(f->svc, sync_request(f, 5, "conv-a", other, 12)),
                     CAIRN_OK);
    r = wait_for(&f->col, 5);
    assert_string_equal(r->text, plain_other);
    /* another name is another session; a name busy generating is refused */
    assert_int_equal(cairn_service_submit(f->svc, sync_request(f, 6, "conv-b", turn1, 200)),
                     CAIRN_OK);
    assert_int_equal(cairn_service_submit(f->svc, sync_request(f, 7, "conv-b", turn1, 4)),
                     CAIRN_OK);
    r = wait_for(&f->col, 7);
    assert_int_equal(r->ev.kind, CAIRN_EV_ERROR);
    assert_int_equal(r->ev.code, CAIRN_EBUSY);
    assert_int_equal(wait_for(&f->col, 6)->ev.kind, CAIRN_EV_DONE);
    free(plain);
    free(plain_other);
    stop(f);
}

/* A session call by name (session_key) rather than by id. */
static result *named_call(fixture *f, uint64_t id, cairn_req_kind kind, const char *key,
                          const char *note)
{
    cairn_request *r = cairn_request_new(kind);
    r->id = id;
    r->session_key = strdup(key);
    r->session_key_len = strlen(key);
    if (note) {
        r->note = strdup(note);
        r->note_len = strlen(note);
    }
    cairn_service_submit(f->svc, r);
    return wait_for(&f->col, id);
}

/* The calls that name a session by id find a named session by its name
 * (`cairn chat`'s /save and /load): the note set and read by name, the same
 * session as the id's, an unknown name not found (and not created), and
 * after a restart the name, its history and its note are back. */
static void test_session_calls_by_name(void **state)
{
    (void)state;
    char dir[] = "/tmp/cairn-svc-byname-XXXXXX";
    assert_non_null(mkdtemp(dir));
    fixture *f = start_tiers(512, 4, 64, 64, dir);
    cairn_request *r = sync_request(f, 1, "chat-a", "Once upon a time", 0);
    assert_int_equal(cairn_service_submit(f->svc, r), CAIRN_OK);
    assert_int_equal(wait_for(&f->col, 1)->ev.kind, CAIRN_EV_DONE);
    assert_int_equal(named_call(f, 2, CAIRN_REQ_SESSION_NOTE, "chat-a", "[1]")->ev.kind,
                     CAIRN_EV_DONE);
    result *in = named_call(f, 3, CAIRN_REQ_SESSION_INFO, "chat-a", NULL);
    assert_int_equal(in->ev.kind, CAIRN_EV_DONE);
    assert_string_equal(in->ev.note, "[1]");
    assert_int_equal(in->ev.n_session_tokens, 5);
    cairn_session_id sid = in->ev.session;
    assert_string_equal(session_call(f, 4, CAIRN_REQ_SESSION_INFO, sid, NULL)->ev.note, "[1]");
    /* an unknown name: not found, twice (the lookup creates nothing) */
    for (uint64_t id = 5; id <= 6; id++) {
        in = named_call(f, id, CAIRN_REQ_SESSION_INFO, "chat-b", NULL);
        assert_int_equal(in->ev.kind, CAIRN_EV_ERROR);
        assert_int_equal(in->ev.code, CAIRN_ENOTFOUND);
    }
    stop(f);

    f = start_tiers(512, 4, 64, 64, dir);
    in = named_call(f, 1, CAIRN_REQ_SESSION_INFO, "chat-a", NULL);
    assert_int_equal(in->ev.kind, CAIRN_EV_DONE);
    assert_true(in->ev.session.hi == sid.hi && in->ev.session.lo == sid.lo);
    assert_string_equal(in->ev.note, "[1]");
    assert_int_equal(in->ev.n_session_tokens, 5);
    stop(f);
    rm_rf(dir);
}

int main(void)
{
    model_path = getenv("CAIRN_MODEL");
    if (!model_path) {
        fprintf(stderr, "CAIRN_MODEL is not set\n");
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_matches_reference),
        cmocka_unit_test(test_named_session_sync),
        cmocka_unit_test(test_session_note),
        cmocka_unit_test(test_stored_responses),
        cmocka_unit_test(test_legacy_response_records),
        cmocka_unit_test(test_session_calls_by_name),
        cmocka_unit_test(test_batching_does_not_change_results),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_burst_computes_document_once),
        cmocka_unit_test(test_same_prompt_four_times),
        cmocka_unit_test(test_forked_sessions_share_history),
        cmocka_unit_test(test_sessions),
        cmocka_unit_test(test_tiny_kv_pauses_not_fails),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_stop_strings_and_errors),
        cmocka_unit_test(test_restart_serves_from_disk),
        cmocka_unit_test(test_many_sessions_resume_from_lower_tiers),
        cmocka_unit_test(test_tenants_are_isolated),
        cmocka_unit_test(test_fair_between_clients),
        cmocka_unit_test(test_pins_hold_through_eviction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
