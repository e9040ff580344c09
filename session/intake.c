/*
 * session/intake.c — one request from the inbox: session calls (open,
 * append, fork, truncate, close, info), generations (plain, on a session,
 * or on a named session brought to a given prompt first), cancels and
 * stats; and the replies that wait until a persisted session is durable.
 */
#include "session/session_impl.h"

#include <time.h>

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


/* Turn a generate / session.generate request into a waiting job. Takes the
 * request. */
static void start_generation(cairn_service *s, cairn_request *r, session *sess)
{
    job *j = calloc(1, sizeof *j);
    int rc = j ? CAIRN_OK : CAIRN_ENOMEM;
    if (rc == CAIRN_OK) {
        j->req = r;
        j->sess = sess;
        j->eog_token = -1;
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
    if (rc == CAIRN_OK && s->spec && (rc = job_spec_create(s, j)) != CAIRN_OK)
        msg = rc == CAIRN_ENOMEM ? "out of memory"
                                 : "invalid draft settings (depth 1..16, top_k 1..16, n 1..255 "
                                   "and below the batch size)";
    char pin_msg[300];
    if (rc == CAIRN_OK && r->n_pins && (rc = pins_reserve(s, j, pin_msg, sizeof pin_msg)))
        msg = pin_msg;
    if (rc != CAIRN_OK) {
        svc_emit_error(s, r, rc, msg);
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


/* Reply to a session call now, or — for a persisted session — once its
 * record (or its deletion) is durable. Takes nothing; copies what it needs. */
static void reply_session(cairn_service *s, cairn_request *r, session *x, int64_t n_tokens,
                          bool deleted)
{
    if (!x->persist || !s->have_disk) {
        svc_emit_session(s, r, x->id, n_tokens);
        return;
    }
    deferred *d = calloc(1, sizeof *d);
    if (!d) {
        svc_emit_error(s, r, CAIRN_ENOMEM, "out of memory");
        return;
    }
    d->cookie = ++s->next_cookie;
    d->id = x->id;
    d->n_tokens = n_tokens;
    int rc = deleted ? record_delete(s, x->id, d->cookie) : record_put(s, x, d->cookie);
    if (rc != CAIRN_OK) {
        free(d);
        svc_emit_error(s, r, CAIRN_EIO, "the session could not be made durable");
        return;
    }
    /* the request is answered later: keep a copy of what the reply needs */
    d->req = cairn_request_new(r->kind);
    if (!d->req) {
        free(d);
        svc_emit_error(s, r, CAIRN_ENOMEM, "out of memory");
        return;
    }
    d->req->client = r->client;
    d->req->id = r->id;
    d->outstanding = 1;
    d->next = s->deferred;
    s->deferred = d;
}


/* A durability completion (persist or record) for a finished job or a
 * deferred session reply. */
void intake_durable_done(cairn_service *s, uint64_t cookie, int status)
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
        job_reply(s, j);
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
            svc_emit_error(s, d->req, CAIRN_EIO, "the session could not be made durable");
        else
            svc_emit_session(s, d->req, d->id, d->n_tokens);
        cairn_request_free(d->req);
        free(d);
        return;
    }
}


/* ---- session calls ---------------------------------------------------------- */

static void handle_open(cairn_service *s, cairn_request *r)
{
    session *x = session_new(s, r, NULL);
    if (!x)
        return;
    if (r->n_tokens > (size_t)s->n_ctx || tokvec_append(&x->history, r->tokens, r->n_tokens)) {
        session_destroy(s, x);
        svc_emit_error(s, r, CAIRN_ERANGE, "the session's text does not fit in the context");
        return;
    }
    x->persist = r->persist;
    x->tenant = r->tenant;
    session_mark_live(s, x); /* a system prompt it opens with may be cached */
    if (x->persist && !s->have_disk) {
        session_destroy(s, x);
        svc_emit_error(s, r, CAIRN_EUNSUPPORTED, "persist needs a disk tier (serve --cache-dir)");
        return;
    }
    reply_session(s, r, x, (int64_t)x->history.n, false);
}

/* append and generate: r's tokens continue the session (a chat turn first
 * closes a reply left open with the template's turn end). Takes r when it
 * starts a generation; returns true then. */
static bool handle_append(cairn_service *s, cairn_request *r)
{
    session *x = session_idle_of_request(s, r, "the session is generating; wait for it to finish");
    if (!x)
        return false;
    int rc;
    if (r->chat_turn && x->reply_open && s->n_turn_end > 0 &&
        (rc = prepend_tokens(r, s->turn_end, s->n_turn_end)) != CAIRN_OK) {
        svc_emit_error(s, r, rc, "out of memory");
        return false;
    }
    if (x->history.n + r->n_tokens >= (size_t)s->n_ctx) {
        svc_emit_error(s, r, CAIRN_ERANGE, "the session would not fit in the context");
        return false;
    }
    if (r->n_tokens > 0 || r->kind == CAIRN_REQ_SESSION_APPEND)
        x->reply_open = false;
    if (r->kind == CAIRN_REQ_SESSION_GENERATE) {
        start_generation(s, r, x);
        return true;
    }
    if (tokvec_append(&x->history, r->tokens, r->n_tokens)) {
        svc_emit_error(s, r, CAIRN_ENOMEM, "out of memory");
        return false;
    }
    reply_session(s, r, x, (int64_t)x->history.n, false);
    return false;
}

/* A named session brought to r's prompt — its history cut where the two
 * part, the rest of the prompt appended — then a generation. What a client
 * that resends its whole conversation every turn (OpenAI's API) needs: the
 * common part is served from the session's cached pages, the front end
 * keeps no copy of the history. Takes r when it starts a generation;
 * returns true then. */
static bool handle_sync(cairn_service *s, cairn_request *r)
{
    if (!r->session_key || r->session_key_len == 0) {
        svc_emit_error(s, r, CAIRN_EINVAL, "a session name is required");
        return false;
    }
    if (r->n_tokens >= (size_t)s->n_ctx) {
        svc_emit_error(s, r, CAIRN_ERANGE, "the prompt does not fit in the context");
        return false;
    }
    if (r->persist && !s->have_disk) {
        svc_emit_error(s, r, CAIRN_EUNSUPPORTED, "persist needs a disk tier (serve --cache-dir)");
        return false;
    }
    session *x = session_named(s, r);
    if (!x)
        return false;
    if (x->busy) {
        svc_emit_error(s, r, CAIRN_EBUSY,
                       "a request of this session is still running; wait for it to finish");
        return false;
    }
    /* a conversation the client asked to keep (`cairn chat`'s /save with a
     * cache directory) is durable from now on: its record and pages are
     * written as each turn ends, so it survives a crash, not only a clean
     * stop; it is never the least recently used one pushed out for room */
    if (r->persist)
        x->persist = true;
    size_t common = 0, lim = x->history.n < r->n_tokens ? x->history.n : r->n_tokens;
    while (common < lim && x->history.v[common] == r->tokens[common])
        common++;
    if (common < x->history.n) {
        session_unmark_live(s, x);
        x->history.n = common; /* the client's conversation parted here */
        x->reply_open = false;
        session_mark_live(s, x);
    }
    /* the rest of the prompt becomes the turn's new tokens */
    size_t rest = r->n_tokens - common;
    memmove(r->tokens, r->tokens + common, rest * sizeof *r->tokens);
    r->n_tokens = rest;
    if (rest > 0)
        x->reply_open = false;
    start_generation(s, r, x);
    return true;
}

static void handle_fork(cairn_service *s, cairn_request *r)
{
    session *x = session_of_request(s, r), *child;
    if (!x)
        return;
    /* a stored response continued is the last to be pushed out */
    responses_touch(s, x);
    if (!(child = session_new(s, r, x)))
        return;
    /* The pages are shared through the tree: the child's history finds the
     * same pages as the parent's. Only the token ids are copied. */
    if (tokvec_append(&child->history, x->history.v, x->history.n)) {
        session_destroy(s, child);
        svc_emit_error(s, r, CAIRN_ENOMEM, "out of memory");
        return;
    }
    /* a fork of a durable session is durable too */
    child->persist = x->persist;
    child->reply_open = x->reply_open;
    child->tenant = x->tenant;
    session_mark_live(s, child);
    reply_session(s, r, child, (int64_t)child->history.n, false);
}

static void handle_truncate(cairn_service *s, cairn_request *r)
{
    session *x = session_idle_of_request(s, r, "the session is generating; wait for it to finish");
    if (!x)
        return;
    if (r->n_keep < 0 || (size_t)r->n_keep > x->history.n) {
        svc_emit_error(s, r, CAIRN_EINVAL, "n_tokens is larger than the session");
        return;
    }
    session_unmark_live(s, x);
    x->history.n = (size_t)r->n_keep;
    x->reply_open = false; /* the cut may be anywhere: the client knows where */
    session_mark_live(s, x);
    reply_session(s, r, x, (int64_t)x->history.n, false);
}

/* The session's note replaced by the request's (taken). */
static void handle_note(cairn_service *s, cairn_request *r)
{
    session *x = session_idle_of_request(s, r, "the session is generating; wait for it to finish");
    if (!x)
        return;
    if (r->note_len > CAIRN_SESSION_NOTE_MAX) {
        svc_emit_error(s, r, CAIRN_ERANGE, "the note is too large");
        return;
    }
    free(x->note);
    x->note = r->note_len ? r->note : NULL;
    x->note_len = x->note ? r->note_len : 0;
    if (x->note)
        r->note = NULL;
    reply_session(s, r, x, (int64_t)x->history.n, false);
}

static void handle_close(cairn_service *s, cairn_request *r)
{
    session *x = session_idle_of_request(s, r, "the session is generating; cancel it first");
    if (!x)
        return;
    reply_session(s, r, x, 0, true);
    record_unshare(s, x->id); /* closed for good: on every replica */
    session_destroy(s, x);
}

/* The asking tenant's sessions, and nothing of any other tenant's. Stored
 * Responses are not listed: there may be thousands, and they are reached by
 * their response id (GET /v1/responses/{id}). */
static void handle_list(cairn_service *s, cairn_request *r)
{
    size_t cap = s->n_sessions < CAIRN_SESSION_LIST_MAX ? s->n_sessions : CAIRN_SESSION_LIST_MAX;
    cairn_session_entry *list = cap ? calloc(cap, sizeof *list) : NULL;
    if (cap && !list) {
        svc_emit_error(s, r, CAIRN_ENOMEM, "out of memory");
        return;
    }
    size_t n = 0;
    for (size_t b = 0; b < s->n_buckets && n < cap; b++)
        for (session *x = s->buckets[b]; x && n < cap; x = x->next) {
            if (x->tenant != r->tenant || x->response)
                continue;
            cairn_session_entry *e = &list[n++];
            e->id = x->id;
            if (x->key) {
                size_t k = x->key_len < sizeof e->name - 1 ? x->key_len : sizeof e->name - 1;
                memcpy(e->name, x->key, k);
            }
            e->n_tokens = (int64_t)x->history.n;
            e->persist = x->persist;
            e->busy = x->busy;
            e->last_used = x->last_used;
        }
    cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_SESSION_LIST,
                      .client = r->client, .id = r->id, .sessions = list, .n_listed = n};
    svc_emit(s, &ev);
    free(list);
}

/* ---- the rest ----------------------------------------------------------------- */

/* Requests that name a session by id (not SESSION_SYNC: that one is by name). */
static bool names_session(cairn_req_kind kind)
{
    switch (kind) {
    case CAIRN_REQ_SESSION_APPEND:
    case CAIRN_REQ_SESSION_GENERATE:
    case CAIRN_REQ_SESSION_FORK:
    case CAIRN_REQ_SESSION_TRUNCATE:
    case CAIRN_REQ_SESSION_CLOSE:
    case CAIRN_REQ_SESSION_INFO:
    case CAIRN_REQ_SESSION_NOTE:
        return true;
    default:
        return false;
    }
}

void intake_handle(cairn_service *s, cairn_request *r)
{
    session *x;
    /* Stored responses past their TTL go: in a sweep now and then, and the
     * one this request names now, so that it is not found (no request ever
     * sees one that has expired, however long the sweep waits). */
    const int64_t now = (int64_t)time(NULL);
    responses_expire(s, now);
    if (names_session(r->kind) && !r->session_key && (x = session_find(s, r->session)) &&
        response_expired(s, x, now)) {
        response_drop(s, x);
        s->resp_expired++;
    }
    /* A session this replica does not hold may be another's that moved here
     * (its replica died): its record comes from the shared tier first. */
    if (names_session(r->kind) && !r->session_key && !session_find(s, r->session) &&
        records_lookup(s, r))
        return;
    switch (r->kind) {
    case CAIRN_REQ_GENERATE:
        start_generation(s, r, NULL);
        return;
    case CAIRN_REQ_SESSION_OPEN: handle_open(s, r); break;
    case CAIRN_REQ_SESSION_APPEND:
    case CAIRN_REQ_SESSION_GENERATE:
        if (handle_append(s, r))
            return;
        break;
    case CAIRN_REQ_SESSION_SYNC:
        if (handle_sync(s, r))
            return;
        break;
    case CAIRN_REQ_SESSION_FORK: handle_fork(s, r); break;
    case CAIRN_REQ_SESSION_TRUNCATE: handle_truncate(s, r); break;
    case CAIRN_REQ_SESSION_CLOSE: handle_close(s, r); break;
    case CAIRN_REQ_SESSION_INFO:
        if ((x = session_of_request(s, r))) {
            cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_SESSION,
                              .client = r->client, .id = r->id, .session = x->id,
                              .n_session_tokens = (int64_t)x->history.n, .note = x->note,
                              .note_len = x->note_len};
            svc_emit(s, &ev);
        }
        break;
    case CAIRN_REQ_SESSION_NOTE: handle_note(s, r); break;
    case CAIRN_REQ_CANCEL: {
        job *j = sched_find_job(s, r->client, r->target);
        if (j)
            j->cancelled = true;
        cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_CANCEL, .client = r->client,
                          .id = r->id, .found = j != NULL};
        svc_emit(s, &ev);
        break;
    }
    case CAIRN_REQ_CACHE_STATS: {
        cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_STATS, .client = r->client,
                          .id = r->id};
        svc_fill_stats(s, &ev.stats);
        svc_emit(s, &ev);
        break;
    }
    case CAIRN_REQ_CACHE_EXPLAIN: {
        /* read-only: no fetch, no lock, no recency bump, no counters */
        cairn_event ev = {.kind = CAIRN_EV_DONE, .what = CAIRN_DONE_EXPLAIN, .client = r->client,
                          .id = r->id, .prompt_tokens = (int64_t)r->n_tokens};
        svc_explain(s, r->tenant, r->tokens, r->n_tokens, -1, false, &ev.miss);
        if (ev.miss.known)
            ev.cached_tokens = ev.miss.departure / s->page_size * s->page_size;
        s->stats.explains++;
        svc_emit(s, &ev);
        break;
    }
    case CAIRN_REQ_SESSION_LIST: handle_list(s, r); break;
    case CAIRN_REQ_CLIENT_GONE: sched_cancel_client(s, r->client); break;
    default: svc_emit_error(s, r, CAIRN_EINVAL, "unknown request kind"); break;
    }
    cairn_request_free(r);
}
