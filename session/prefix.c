/*
 * session/prefix.c — computing a prompt prefix once, however many requests
 * want it at the same moment.
 *
 * Three rules, applied by the scheduler:
 *
 *   wait     a waiting request whose prompt shares at least a page with a
 *            job that is running or fetching, and that job has not yet
 *            computed the shared part, is not admitted: it would compute
 *            the same tokens beside it. It stays in the queue (holding no
 *            slot) and goes in as soon as the shared part is computed, or
 *            the other job leaves (cancelled, paused, failed). The job
 *            that computes goes first and is not slowed.
 *
 *         time ─▶   A: [doc ......... doc][qA ans]          (one request
 *                   B:     waits ──────▶ [qB ans]           computes the
 *                   C:     waits ──────▶ [qC ans]           document)
 *
 *   extend   after every step a job gives the tree the whole pages it has
 *            computed (store.h, "computing a prefix once"), so the waiting
 *            requests match them like any cached prefix.
 *
 *   remote   with a Redis shared by replicas that give it every page they
 *            compute (--shared-write all), a fetch whose answer ends at a
 *            page another replica looked up lately is not admitted: that
 *            replica is computing the prefix now (store.h, busy_elsewhere).
 *            The job goes back to the head of the queue and fetches again
 *            REMOTE_RETRY_S later, finding in Redis the pages written
 *            meanwhile; it goes in when its answer ends at a page nobody
 *            else is computing (its own question), or after shared_wait_s
 *            in which no new page came (that replica died, or has not
 *            started): then it computes the rest itself.
 *
 *         replica A:  [doc ........ doc][qA ans]     pages ──▶ Redis
 *         replica B:   fetch, wait, fetch ─▶ [qB ans]  (pages from Redis)
 *
 *   partial  at admission, a match that ends inside a page takes the rows
 *            it shares from a cached page (the tree, a tail) or from a
 *            running job's page, by copy: only the request's own tokens
 *            are computed.
 *
 * With an EAGLE head matches stay whole pages: a head row depends on the
 * token after it (model.h), so a copied half page would hold a head row
 * computed for another continuation. (A draft model's rows depend on what
 * comes before only, like the target's: its matches go to the token.)
 */
#include "session/session_impl.h"

static size_t lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Whether j should wait for `other`, which is running (or fetching, when
 * !running) and shares a prefix with it that it has not computed yet. j
 * waits when the shared part is at least a page and longer than what the
 * other has computed: exactly when their first max(page, computed + 1)
 * tokens agree — one memcmp, which stops at the first difference. */
static bool waits_for(const cairn_service *s, const job *j, const job *other, bool running)
{
    if (other == j || other->cancelled || other->req->tenant != j->req->tenant)
        return false;
    /* the last token of j is always computed, for its logits; only the
     * other's prompt counts: prefill goes a chunk a step, its generated
     * tokens one a step (waiting for those would be slower than computing) */
    size_t bound = j->seq.n - 1 < other->n_prompt ? j->seq.n - 1 : other->n_prompt;
    size_t have = running ? other->n_computed : 0;
    size_t need = have + 1 > (size_t)s->page_size ? have + 1 : (size_t)s->page_size;
    return need <= bound && memcmp(j->seq.v, other->seq.v, need * sizeof *j->seq.v) == 0;
}

bool prefix_should_wait(const cairn_service *s, const job *j)
{
    if (!s->prefix_cache || j->seq.n < 2)
        return false;
    for (int i = 0; i < s->n_running; i++)
        if (waits_for(s, j, s->running[i], true))
            return true;
    for (int i = 0; i < s->n_fetching; i++)
        if (waits_for(s, j, s->fetching[i], false))
            return true;
    return false;
}

#define REMOTE_RETRY_S 0.05
#define REMOTE_WAIT_DEFAULT_S 5.0

/* How long a waiter goes without a new page before it computes the rest
 * itself: --shared-wait, else at least REMOTE_WAIT_DEFAULT_S and four
 * times what one full step takes here (the replica computing the prefix
 * shares its pages a step at a time, and a step on a slow model or a
 * loaded machine can take longer than 5 s: giving up then computes the
 * prefix twice while the other replica is about to share it). */
static double remote_patience(const cairn_service *s)
{
    if (s->cfg.shared_wait_s > 0)
        return s->cfg.shared_wait_s;
    double step = s->compute_rate > 0 ? (double)s->cfg.max_batch_tokens / s->compute_rate : 0;
    return 4 * step > REMOTE_WAIT_DEFAULT_S ? 4 * step : REMOTE_WAIT_DEFAULT_S;
}

bool prefix_wait_remote(cairn_service *s, job *j, const cairn_kvcache_event *ev)
{
    if (!ev || ev->status != CAIRN_OK || !ev->busy_elsewhere || j->cancelled ||
        j->remote_gave_up || s->cfg.shared_wait_s < 0)
        return false;
    const double now = cairn_now();
    const double patience = remote_patience(s);
    if (!j->remote_wait) {
        j->remote_wait = true;
        j->remote_progress_at = now;
        j->remote_resident = ev->resident_pages;
        s->stats.remote_waits++;
    } else if (ev->resident_pages > j->remote_resident) {
        j->remote_resident = ev->resident_pages;
        j->remote_progress_at = now;
    } else if (now - j->remote_progress_at > patience) {
        j->remote_gave_up = true;
        s->stats.remote_wait_timeouts++;
        return false;
    }
    j->remote_retry_at = now + REMOTE_RETRY_S;
    cairn_kvcache_release(s->cache, ev->node); /* the pages stay cached here */
    waiting_push(s, j, true);
    return true;
}

void prefix_extend(cairn_service *s, job *j)
{
    if (!s->prefix_cache)
        return;
    size_t n_full = j->n_computed / (size_t)s->page_size;
    if (n_full > j->n_pages)
        n_full = j->n_pages;
    if (n_full <= j->n_tree_pages)
        return;
    /* CAIRN_EBUSY / ENOMEM: the pages stay the job's until it ends */
    (void)cairn_kvcache_extend(s->cache, j->req->tenant, j->seq.v, n_full, j->pages,
                               &j->n_tree_pages, &j->hold);
    if (j->share_wanted)
        cairn_kvcache_share(s->cache, j->hold); /* the next replica finds it */
}

/* The running job with the longest run of computed tokens equal to
 * j->seq[at ..] (at most `limit`) after the same first `at` tokens; its
 * length in *best. */
static const job *partial_source(const cairn_service *s, const job *j, size_t at, size_t limit,
                                 size_t *best)
{
    const job *src = NULL;
    *best = 0;
    const size_t page = at / (size_t)s->page_size;
    for (int i = 0; i < s->n_running; i++) {
        const job *o = s->running[i];
        if (o == j || o->req->tenant != j->req->tenant || o->n_computed <= at ||
            o->n_pages <= page || o->seq.n < at ||
            memcmp(o->seq.v, j->seq.v, at * sizeof *j->seq.v) != 0)
            continue;
        size_t n = o->n_computed - at < limit ? o->n_computed - at : limit;
        size_t l = lcp(o->seq.v + at, n, j->seq.v + at, n);
        if (l > *best) {
            *best = l;
            src = o;
        }
    }
    return src;
}

size_t prefix_take_partial(cairn_service *s, job *j, int *tier)
{
    *tier = CAIRN_TIER_DEVICE;
    const size_t ps = (size_t)s->page_size, at = j->n_computed;
    if (!s->prefix_cache || (j->spec && cairn_spec_whole_pages(s->spec)) || at % ps != 0 || j->n_pages != at / ps ||
        j->seq.n < at + 2)
        return 0;
    const size_t n_next = j->seq.n - 1 - at; /* the last token stays to compute */
    const size_t limit = n_next < ps - 1 ? n_next : ps - 1;
    size_t from_job = 0;
    const job *src = partial_source(s, j, at, limit, &from_job);
    if (job_reserve_pages(j, j->n_pages + 1) != CAIRN_OK)
        return 0;
    /* the cache takes a page only when it has something to copy into it */
    int32_t dst = -1;
    size_t k = 0;
    if (cairn_kvcache_partial(s->cache, j->req->tenant, j->hold, j->n_tree_pages,
                              j->seq.v + at, n_next, &dst, &k, tier) != CAIRN_OK)
        k = 0;
    /* a running job's partial page says which of its draft-model rows are
     * final once synced (they are computed lazily) */
    if (src && from_job > k && job_spec_sync(s, (job *)src) == CAIRN_OK &&
        (dst >= 0 || cairn_kvcache_alloc(s->cache, 1, &dst) == CAIRN_OK) &&
        cairn_kvcache_copy_page(s->cache, src->pages[at / ps], dst) == CAIRN_OK) {
        k = from_job;
        *tier = CAIRN_TIER_DEVICE; /* a running job's page */
    }
    if (k == 0) {
        if (dst >= 0)
            cairn_kvcache_free_pages(s->cache, 1, &dst);
        return 0;
    }
    j->pages[j->n_pages++] = dst;
    j->n_computed += k;
    s->stats.partial_tokens += k;
    return k;
}
