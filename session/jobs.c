/*
 * session/jobs.c — one generation ("job"): the pages it holds, sampling
 * (grammar mask, logit bias, logprobs), its text and stop strings, the
 * deltas it streams, and how it ends. The scheduler (scheduler.c) decides
 * when a job runs; this file is what running means for it.
 */
#include "session/session_impl.h"

#include <stdio.h>

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
    free(r->session_key);
    free(r->note);
    free(r);
}


int job_reserve_pages(job *j, size_t n)
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
cairn_kv_hold *job_release_pages(cairn_service *s, job *j)
{
    size_t n_full = j->n_computed / (size_t)s->page_size;
    size_t n_pages = j->n_pages;
    cairn_kv_hold *leaf = NULL;
    /* The partial last page, when it is the job's: kept as a tail, so the
     * next turn reuses it (not with an EAGLE head: see prefix.c). */
    int32_t tail = -1;
    if (s->prefix_cache && !(j->spec && cairn_spec_whole_pages(s->spec)) && j->n_computed % (size_t)s->page_size &&
        n_full < n_pages && n_full >= j->n_tree_pages && job_spec_sync(s, j) == CAIRN_OK) {
        tail = j->pages[n_full];
        j->pages[n_full] = j->pages[n_pages - 1];
        n_pages--;
    }
    /* a sequence's cache key is its tokens in its tenant's namespace */
    cairn_kvcache_commit(s->cache, j->req->tenant, s->prefix_cache ? j->seq.v : NULL, n_full,
                         j->pages, j->n_tree_pages, n_pages, j->hold, &leaf);
    if (j->share_wanted && leaf)
        cairn_kvcache_share(s->cache, leaf);
    if (tail >= 0)
        cairn_kvcache_keep_tail(s->cache, j->req->tenant, j->seq.v, j->n_computed, tail);
    j->hold = NULL;
    j->n_pages = j->n_tree_pages = 0;
    j->n_computed = 0;
    return leaf;
}

/* Make the page table cover `n_tokens` tokens, evicting unlocked cached pages
 * if needed. CAIRN_EFULL when that is not enough. */
int job_ensure_pages(cairn_service *s, job *j, size_t n_tokens)
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

void job_free(job *j)
{
    if (!j)
        return;
    pins_job_gone(j);
    cairn_request_free(j->req);
    cairn_sampler_free(j->sampler);
    cairn_grammar_matcher_free(j->matcher);
    cairn_spec_seq_free(j->spec);
    cairn_detok_free(j->detok);
    free(j->seq.v);
    free(j->pages);
    free(j->text);
    free(j->lps);
    free(j);
}


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
    int which = 0;
    for (int i = 0; i < g->n_stop; i++) {
        size_t len = strlen(g->stop[i]);
        if (len == 0)
            continue;
        /* only the unsent tail (plus overlap) can hold a new occurrence */
        size_t from = j->text_sent > len ? j->text_sent - len : 0;
        char *hit = memmem(j->text + from, j->text_len - from, g->stop[i], len);
        if (hit && (size_t)(hit - j->text) < best) {
            best = (size_t)(hit - j->text);
            which = i + 1;
        }
    }
    if (best == SIZE_MAX)
        return false;
    j->stop_string = which;
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
    svc_emit(s, &ev);
    if (end > j->text_sent)
        j->text_sent = end;
    j->tokens_sent = (size_t)j->n_gen;
}


void job_finish(cairn_service *s, job *j, bool emit_event)
{
    cairn_kv_hold *leaf = job_release_pages(s, j);
    s->pages_tight = false; /* its pages are free to be evicted now */
    /* its prompt's pages are the tree's now: what it asked to keep is kept */
    if (emit_event && strcmp(j->finish ? j->finish : "", "cancelled") != 0)
        pins_commit(s, j);
    session *x = j->sess;
    if (x) {
        /* the session's history becomes prompt + generated tokens */
        x->busy = false;
        x->reply_open = true;
        session_unmark_live(s, x);
        x->history.n = 0;
        tokvec_append(&x->history, j->seq.v, j->seq.n);
        session_mark_live(s, x);
    }
    if (!emit_event) {
        job_free(j);
        return;
    }
    svc_note_finished(s, j);
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
    job_reply(s, j);
}

void job_reply(cairn_service *s, job *j)
{
    if (j->durable_failed)
        svc_emit_error(s, j->req, CAIRN_EIO, "the session could not be made durable");
    else
        svc_emit_generation_done(s, j);
    job_free(j);
}


/* `base` with the fields `over` sets (non-zero) replaced. */
cairn_spec_params draft_override(cairn_spec_params base, const cairn_spec_params *over)
{
    if (over->depth)
        base.depth = over->depth;
    if (over->top_k)
        base.top_k = over->top_k;
    if (over->n_draft)
        base.n_draft = over->n_draft;
    if (over->ngram_min)
        base.ngram_min = over->ngram_min;
    if (over->ngram_max)
        base.ngram_max = over->ngram_max;
    if (over->chain_max)
        base.chain_max = over->chain_max;
    if (over->fixed_length)
        base.fixed_length = true;
    return base;
}

/* A speculative step's walk draws each token as job_take_token would: the
 * grammar's mask first (spec_hook_filter), then the job's own sampler (lent
 * to the decoder), then what job_push_token does before it keeps a token
 * (spec_hook_accept), so a request decodes to the same tokens whether a
 * step speculated or not. */
static int spec_hook_filter(void *ctx, float *logits, int n_vocab)
{
    job *j = ctx;
    return j->matcher ? cairn_grammar_matcher_mask(j->matcher, logits, n_vocab) : CAIRN_OK;
}

static bool spec_hook_accept(void *ctx, int32_t tok)
{
    job *j = ctx;
    if (!j->req->gen.ignore_eos && cairn_vocab_is_eog(j->vocab, tok))
        return true; /* job_push_token ends the job with it */
    if (j->matcher && (cairn_grammar_matcher_accept(j->matcher, tok) != CAIRN_OK ||
                       cairn_grammar_matcher_done(j->matcher)))
        return true;
    return false;
}

/* The job's speculative sequence: every job's pages have room for the
 * methods' KV (a draft model's rows are computed when it proposes, and the
 * pages say which are there); it may speculate unless it asked not to. Grammars,
 * logprobs and penalties speculate too: tokens are drawn as plain decoding
 * draws them (model.h). */
int job_spec_create(cairn_service *s, job *j)
{
    const cairn_gen_params *g = &j->req->gen;
    const cairn_spec_params dp = draft_override(s->draft, &g->draft);
    j->spec_ok = !g->no_speculation && s->draft_max_batch > 0;
    int rc = cairn_spec_seq_create(s->spec, &dp, &g->sampling, g->spec_methods, &j->spec);
    if (rc != CAIRN_OK)
        return rc;
    cairn_spec_seq_set_tenant(j->spec, j->req->tenant);
    j->vocab = s->vocab;
    cairn_spec_seq_use_sampler(j->spec, j->sampler);
    const cairn_spec_hooks hooks = {.ctx = j, .filter = spec_hook_filter,
                                    .accept = spec_hook_accept, .logprobs = g->logprobs};
    cairn_spec_seq_set_hooks(j->spec, &hooks);
    /* the pending token and the tree, or the methods' scratch rows */
    j->spec_span = cairn_spec_seq_span(j->spec);
    j->spec_rows = 1 + dp.n_draft;
    return CAIRN_OK;
}


void job_note_tokens_time(cairn_service *s, job *j, int n)
{
    double now = cairn_now();
    if (j->t_last_token == 0) {
        svc_histogram_observe(&s->stats.ttft, now - j->req->submitted_at);
        svc_vllm_observe(s, CAIRN_VLLM_TTFT, now - j->req->submitted_at);
        j->t_first_token = now;
    } else {
        svc_vllm_observe(s, CAIRN_VLLM_ITL, now - j->t_last_token); /* once a step */
        for (int t = 0; t < n; t++) /* the step's time, shared by its tokens */
            svc_histogram_observe(&s->stats.inter_token, (now - j->t_last_token) / n);
    }
    j->t_last_token = now;
}

/* Sample the next token of `j` from `logits`; returns true when the job is
 * finished (finish reason set). */
bool job_take_token(cairn_service *s, job *j, float *logits)
{
    int32_t tok;
    job_note_tokens_time(s, j, 1);
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
    return job_push_token(s, j, tok, want_lp ? lp : NULL, false);
}

/* The grammar's mask of j as a bitset (bits[ceil(n_vocab/32)], 1 =
 * allowed), for sampling where the logits are: the matcher masks a row of
 * zeros (`scratch`, n_vocab floats) exactly as job_take_token has it mask
 * the logits, and what it left finite is allowed. False when no token is
 * allowed (job_take_token's end: the caller finishes the job with
 * job_take_masked_out). */
bool job_grammar_bits(cairn_service *s, job *j, float *scratch, uint32_t *bits)
{
    memset(scratch, 0, (size_t)s->n_vocab * sizeof *scratch);
    if (cairn_grammar_matcher_mask(j->matcher, scratch, s->n_vocab) != CAIRN_OK)
        return false;
    const int words = (s->n_vocab + 31) / 32;
    memset(bits, 0, (size_t)words * sizeof *bits);
    for (int t = 0; t < s->n_vocab; t++)
        if (scratch[t] == 0.0f)
            bits[t >> 5] |= 1u << (t & 31);
    return true;
}

/* job_take_token's end for a job whose grammar allowed no token. */
bool job_take_masked_out(cairn_service *s, job *j)
{
    job_note_tokens_time(s, j, 1);
    j->finish = "stop";
    return true;
}

/* job_take_token for a token drawn by cairn_sample_batch_run with j's
 * sampler (and grammar bits): `status` is its row's, lp its logprobs (NULL
 * when not asked for). */
bool job_take_sampled(cairn_service *s, job *j, int32_t tok, int status,
                      const cairn_token_logprob *lp)
{
    job_note_tokens_time(s, j, 1);
    if (status != CAIRN_OK) {
        j->finish = "stop";
        return true;
    }
    return job_push_token(s, j, tok, j->req->gen.logprobs ? lp : NULL, false);
}

/* Append the chosen token `tok` to j (sampled here, or accepted by a
 * speculative step); lp: NULL, or the chosen token's logprob then the
 * n_logprobs alternatives. True when the job is finished. */
bool job_push_token(cairn_service *s, job *j, int32_t tok, const cairn_token_logprob *lp,
                    bool drawn_by_spec)
{
    const bool want_lp = lp != NULL;
    if (!j->req->gen.ignore_eos && cairn_vocab_is_eog(s->vocab, tok)) {
        j->finish = "stop";
        j->eog_token = tok;
        return true;
    }
    /* a speculative step's walk fed the matcher and the sampler already
     * (spec_hook_accept) */
    if (!drawn_by_spec && j->matcher && cairn_grammar_matcher_accept(j->matcher, tok) != CAIRN_OK) {
        j->finish = "stop"; /* cannot happen after the mask; never emit it */
        return true;
    }
    if (!drawn_by_spec)
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
    /* a speculative step's walk has fed the matcher all of its tokens
     * before the first is pushed: whether the grammar is complete is asked
     * after the last of them (finish_speculative), never in the middle,
     * where the matcher is already past the tokens still to come */
    if (job_check_stop(j) ||
        (!drawn_by_spec && j->matcher && cairn_grammar_matcher_done(j->matcher))) {
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

void job_fail(cairn_service *s, job *j, int code, const char *msg)
{
    j->finish = "error"; /* vLLM's finished_reason for an engine failure */
    svc_note_finished(s, j);
    svc_emit_error(s, j->req, code, msg);
    job_finish(s, j, false);
}

/* Speculative decoding failed on j: its own pages may lack method KV, so
 * none of them goes to the tree. */
void job_fail_head(cairn_service *s, job *j)
{
    j->n_computed = j->n_tree_pages * (size_t)s->page_size;
    job_fail(s, j, CAIRN_EBACKEND, "speculative decoding failed");
}

/* KV indices j's pages cover, within the context. */
int job_capacity(const cairn_service *s, const job *j)
{
    size_t cap = j->n_pages * (size_t)s->page_size;
    return (int)(cap < (size_t)s->n_ctx ? cap : (size_t)s->n_ctx);
}

/* The methods over the n tokens j's last forward computed (features[n][dim]
 * when a method reads them, else NULL). */
int job_spec_sync(cairn_service *s, job *j)
{
    if (!j->spec || (size_t)cairn_spec_seq_n_past(j->spec) != j->n_computed)
        return j->spec ? CAIRN_EINVAL : CAIRN_OK; /* its method rows are not known good */
    int rc = cairn_spec_seq_set_pages(j->spec, j->pages, job_capacity(s, j));
    return rc == CAIRN_OK ? cairn_spec_seq_sync(j->spec) : rc;
}

int job_spec_advance(cairn_service *s, job *j, const float *features, int n)
{
    int rc = cairn_spec_seq_set_pages(j->spec, j->pages, job_capacity(s, j));
    if (rc == CAIRN_OK)
        rc = cairn_spec_seq_advance(j->spec, j->seq.v, (int)j->seq.n, features, n);
    j->spec_ready = rc == CAIRN_OK && j->seq.n > j->n_computed;
    return rc;
}

