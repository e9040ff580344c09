/*
 * model/sampler.c — turns one row of logits into a token.
 *
 * The pipeline (see model/model.h) is llama.cpp's default chain, so a setting
 * means the same thing in both:
 *
 *   bias       on a copy of the logits: l += logit_bias[token]
 *   penalties  on that copy, for tokens among the last
 *              penalty_last_n accepted ones (count c > 0):
 *                l = l <= 0 ? l * repeat : l / repeat      (repetition)
 *                l -= c * frequency + presence              (OpenAI-style)
 *   greedy     temperature <= 0: argmax of the penalized logits, ties to the
 *              lowest id (top-k/p and min-p always keep the argmax, so they
 *              cannot change it and are skipped)
 *   top-k      keep the k largest (ties: lower id first)
 *   top-p      softmax (temperature 1) over what is left; keep the shortest
 *              best-first prefix whose mass reaches top_p
 *   min-p      keep tokens with p >= min_p * p_max, i.e.
 *              logit >= max_logit + log(min_p)
 *   temperature  logits / T, softmax, one draw.
 *
 * Candidate ordering is total (logit descending, then id ascending), so the
 * kept set and the draw depend only on the logits, parameters and seed, not
 * on the sort algorithm or the machine.
 *
 * Cost: top-p and min-p keep prefixes of the same best-first order, and the
 * best token is always in both, so min-p can be applied first to shrink what
 * must be sorted; when only top-p is on, the best 256 candidates are
 * selected first (a heap, O(n log 256)) and the full order is only computed
 * when their mass does not reach top_p. Nothing is allocated per call: every
 * buffer is sized for n_vocab in cairn_sampler_create.
 *
 * Edge cases: a NaN logit is an impossible token (as -inf); a row without a
 * finite maximum (all NaN/-inf, or any +inf) is refused with CAIRN_EINVAL.
 * Logprobs are the log-softmax of the raw row in double, whatever the
 * penalties and transforms; *chosen is written whenever it is non-NULL, top[]
 * when n_logprobs > 0 (entries past a vocabulary smaller than n_logprobs get
 * token -1, logprob -inf). cairn_sampler_accept ignores ids outside the
 * vocabulary. penalty_last_n must be 0 (off) .. 2^20.
 *
 * Randomness: xoshiro256** seeded by expanding the 64-bit seed with
 * splitmix64; a draw uses the top 53 bits as a double in [0, 1).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

enum {
    MAX_LOGPROBS = 20,
    /* Window sizes beyond this are almost certainly a mistake (the window is
     * allocated up front). */
    MAX_PENALTY_WINDOW = 1 << 20,
    /* How many candidates top-p first tries before sorting everything. */
    TOP_P_FIRST_TRY = 256,
};

struct cairn_sampler {
    cairn_sampling_params params;
    int n_vocab;

    float *logits;   /* [n_vocab] working copy: penalized, NaN -> -inf     */
    int32_t *cand;   /* [n_vocab] candidate ids, best first once sorted     */
    int32_t *scratch;/* [n_vocab] ids, for selections that cannot be in place */
    double *weight;  /* [n_vocab] unnormalized probabilities of cand[]      */

    /* Penalty window: a ring of the last penalty_last_n accepted tokens and
     * how often each token occurs in it. */
    int32_t *window;    /* [penalty_last_n]                                 */
    int window_len;     /* tokens in the ring                               */
    int window_head;    /* slot of the oldest token when full               */
    int32_t *count;     /* [n_vocab]                                        */

    float *bias;        /* [n_vocab] logit bias by token; NULL without one  */

    cairn_rng rng;
};

/* ---- candidate ordering ------------------------------------------------- */

/* True when token a ranks before token b: larger logit, then lower id. */
static inline bool ranks_before(const float *logits, int32_t a, int32_t b)
{
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

/* Restore the heap property below `i` in a heap of `n` ids whose root is the
 * WORST of them (so the best m are kept by evicting the root). */
static void sift_down_worst(const float *logits, int32_t *heap, size_t n, size_t i)
{
    for (;;) {
        size_t worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(logits, heap[worst], heap[l]))
            worst = l;
        if (r < n && ranks_before(logits, heap[worst], heap[r]))
            worst = r;
        if (worst == i)
            return;
        int32_t t = heap[i];
        heap[i] = heap[worst];
        heap[worst] = t;
        i = worst;
    }
}

/* Select the best `m` of ids[0..n) (ids == NULL means 0..n-1) into out[0..m),
 * sorted best first. out must not alias ids unless m == n and out == ids.
 * O(n log m). */
static void select_best(const float *logits, const int32_t *ids, size_t n, int32_t *out, size_t m)
{
    if (m > n)
        m = n;
    if (m == 0)
        return;
    for (size_t i = 0; i < m; i++)
        out[i] = ids ? ids[i] : (int32_t)i;
    for (size_t i = m / 2; i-- > 0;)
        sift_down_worst(logits, out, m, i);
    for (size_t i = m; i < n; i++) {
        int32_t id = ids ? ids[i] : (int32_t)i;
        if (ranks_before(logits, id, out[0])) {
            out[0] = id;
            sift_down_worst(logits, out, m, 0);
        }
    }
    /* Heapsort: moving the worst to the end each time leaves the array best
     * first. */
    for (size_t end = m; end > 1; end--) {
        int32_t t = out[0];
        out[0] = out[end - 1];
        out[end - 1] = t;
        sift_down_worst(logits, out, end - 1, 0);
    }
}

/* ---- parameters --------------------------------------------------------- */

cairn_sampling_params cairn_sampling_defaults(void)
{
    cairn_sampling_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    p.penalty_last_n = 64;
    p.seed = 0;
    p.n_logprobs = 0;
    return p;
}

static bool params_valid(const cairn_sampling_params *p, int n_vocab)
{
    /* Written so that NaN fails every comparison and is refused. */
    if (!isfinite(p->temperature))
        return false;
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return false;
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return false;
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return false;
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
        return false;
    if (p->penalty_last_n < 0 || p->penalty_last_n > MAX_PENALTY_WINDOW)
        return false;
    if (p->n_logprobs < 0 || p->n_logprobs > MAX_LOGPROBS)
        return false;
    if (p->n_logit_bias < 0 || p->n_logit_bias > CAIRN_MAX_LOGIT_BIAS)
        return false;
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= n_vocab ||
            !(p->logit_bias[i].bias >= -100.0f && p->logit_bias[i].bias <= 100.0f))
            return false;
    return true;
}

bool cairn_sampling_has_penalties(const cairn_sampling_params *p)
{
    return p->penalty_last_n > 0 &&
           (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
            p->presence_penalty != 0.0f);
}

/* ---- create / free / accept / reset ------------------------------------- */

int cairn_sampler_create(const cairn_sampling_params *p, int n_vocab, cairn_sampler **out)
{
    if (!p || !out || n_vocab <= 0 || !params_valid(p, n_vocab))
        return CAIRN_EINVAL;
    cairn_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    s->params = *p;
    s->n_vocab = n_vocab;
    s->logits = malloc((size_t)n_vocab * sizeof *s->logits);
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->scratch = malloc((size_t)n_vocab * sizeof *s->scratch);
    s->weight = malloc((size_t)n_vocab * sizeof *s->weight);
    s->count = calloc((size_t)n_vocab, sizeof *s->count);
    if (p->penalty_last_n > 0)
        s->window = malloc((size_t)p->penalty_last_n * sizeof *s->window);
    if (p->n_logit_bias > 0 && (s->bias = calloc((size_t)n_vocab, sizeof *s->bias)))
        for (int i = 0; i < p->n_logit_bias; i++)
            s->bias[p->logit_bias[i].token] = p->logit_bias[i].bias; /* the last wins */
    if (!s->logits || !s->cand || !s->scratch || !s->weight || !s->count ||
        (p->penalty_last_n > 0 && !s->window) || (p->n_logit_bias > 0 && !s->bias)) {
        cairn_sampler_free(s);
        return CAIRN_ENOMEM;
    }
    cairn_rng_seed(&s->rng, p->seed);
    *out = s;
    return CAIRN_OK;
}

void cairn_sampler_free(cairn_sampler *s)
{
    if (!s)
        return;
    free(s->logits);
    free(s->cand);
    free(s->scratch);
    free(s->weight);
    free(s->count);
    free(s->window);
    free(s->bias);
    free(s);
}

void cairn_sampler_accept(cairn_sampler *s, int32_t token)
{
    /* Ids outside the vocabulary cannot be penalized; ignoring them keeps the
     * window consistent with what the penalties can act on. */
    if (!s || token < 0 || token >= s->n_vocab || s->params.penalty_last_n <= 0)
        return;
    int cap = s->params.penalty_last_n;
    if (s->window_len == cap) {
        s->count[s->window[s->window_head]]--;
        s->window[s->window_head] = token;
        s->window_head = (s->window_head + 1) % cap;
    } else {
        s->window[(s->window_head + s->window_len) % cap] = token;
        s->window_len++;
    }
    s->count[token]++;
}

void cairn_sampler_reset(cairn_sampler *s)
{
    if (!s)
        return;
    int cap = s->params.penalty_last_n;
    for (int i = 0; i < s->window_len; i++)
        s->count[s->window[(s->window_head + i) % cap]] = 0;
    s->window_len = 0;
    s->window_head = 0;
    cairn_rng_seed(&s->rng, s->params.seed);
}

/* ---- sampling ----------------------------------------------------------- */

/* The penalized value of a logit seen `count` > 0 times in the window, in
 * float arithmetic as llama.cpp does it. Extreme settings could overflow: a
 * finite logit stays finite (clamped to +-FLT_MAX) so the softmax stays
 * defined; an impossible (-inf) token stays impossible. */
static float penalize(const cairn_sampling_params *p, float logit, int count)
{
    if (isinf(logit))
        return logit; /* only -inf reaches here */
    if (logit <= 0.0f)
        logit *= p->repeat_penalty;
    else
        logit /= p->repeat_penalty;
    logit -= (float)count * p->frequency_penalty + p->presence_penalty;
    if (isnan(logit) || logit < -FLT_MAX)
        return -FLT_MAX;
    return logit > FLT_MAX ? FLT_MAX : logit;
}

/* Writes the n_logprobs most likely tokens of the raw row, best first.
 * `clean` is the raw row with NaN replaced by -inf; log_z its log-sum-exp. */
static void write_top_logprobs(cairn_sampler *s, const float *clean, double log_z,
                               cairn_token_logprob *top)
{
    const int n_top = s->params.n_logprobs;
    const int n_real = n_top < s->n_vocab ? n_top : s->n_vocab;
    select_best(clean, NULL, (size_t)s->n_vocab, s->scratch, (size_t)n_real);
    for (int i = 0; i < n_real; i++) {
        top[i].token = s->scratch[i];
        top[i].logprob = (float)((double)clean[s->scratch[i]] - log_z);
    }
    for (int i = n_real; i < n_top; i++) { /* a vocabulary smaller than n_logprobs */
        top[i].token = -1;
        top[i].logprob = -INFINITY;
    }
}

/* Keeps the best-first prefix of cand[0..*n_cand) holding top_p of the
 * probability mass z (temperature 1, relative to best_logit). The candidates
 * are sorted first when they are not yet. */
static void apply_top_p(cairn_sampler *s, size_t *n_cand, bool sorted, double best_logit,
                        double z)
{
    const float *work = s->logits;
    const double target = (double)s->params.top_p * z;
    size_t n = *n_cand;
    if (!sorted) {
        /* Usually a few hundred tokens carry top_p of the mass: order only
         * those, and everything only when they do not suffice. */
        size_t first = n < TOP_P_FIRST_TRY ? n : TOP_P_FIRST_TRY;
        select_best(work, s->cand, n, s->scratch, first);
        double mass = 0.0;
        for (size_t i = 0; i < first; i++)
            mass += exp((double)work[s->scratch[i]] - best_logit);
        if (first == n || mass >= target) {
            memcpy(s->cand, s->scratch, first * sizeof *s->cand);
            n = first;
        } else {
            select_best(work, s->cand, n, s->cand, n); /* full sort, in place */
        }
    }
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += exp((double)work[s->cand[i]] - best_logit);
        if (cum >= target) {
            n = i + 1;
            break;
        }
    }
    *n_cand = n;
}

/* The working row: the raw logits (NaN -> -inf), then the logit bias and
 * the penalties. CAIRN_EINVAL for a row without a finite maximum. Logprobs,
 * which describe the model itself, are taken from the raw row first
 * (log_z: its log-normaliser, when chosen or top are asked for). */
static int prepare_row(cairn_sampler *s, const float *logits, double *log_z,
                       cairn_token_logprob *top)
{
    const cairn_sampling_params *p = &s->params;
    const int n = s->n_vocab;
    float *work = s->logits; /* [n] */

    /* A row needs a finite maximum to define a distribution: NaN entries are
     * treated as impossible tokens (-inf); +inf, or a row with no finite
     * entry, is refused. */
    float raw_max = -INFINITY;
    for (int i = 0; i < n; i++) {
        float l = isnan(logits[i]) ? -INFINITY : logits[i];
        work[i] = l;
        if (l > raw_max)
            raw_max = l;
    }
    if (!isfinite(raw_max))
        return CAIRN_EINVAL;

    if (log_z) {
        double sum = 0.0;
        for (int i = 0; i < n; i++)
            sum += exp((double)work[i] - (double)raw_max);
        *log_z = (double)raw_max + log(sum);
        if (top && p->n_logprobs > 0)
            write_top_logprobs(s, work, *log_z, top);
    }

    if (s->bias)
        for (int i = 0; i < p->n_logit_bias; i++) {
            int32_t t = p->logit_bias[i].token;
            float raw = isnan(logits[t]) ? -INFINITY : logits[t];
            work[t] = raw + s->bias[t]; /* from the raw value: a repeat adds once */
        }

    if (cairn_sampling_has_penalties(p)) {
        /* A token occurring c times appears c times in the ring; penalizing
         * from the (biased) raw value each time gives the same result once. */
        for (int i = 0; i < s->window_len; i++) {
            int32_t t = s->window[(s->window_head + i) % p->penalty_last_n];
            float raw = isnan(logits[t]) ? -INFINITY : logits[t];
            work[t] = penalize(p, s->bias ? raw + s->bias[t] : raw, s->count[t]);
        }
    }
    return CAIRN_OK;
}

/* Greedy: the argmax of the working row, ties to the lowest id. */
static int32_t row_argmax(const cairn_sampler *s)
{
    int32_t picked = 0;
    for (int i = 1; i < s->n_vocab; i++)
        if (s->logits[i] > s->logits[picked])
            picked = i;
    return picked;
}

/* Sampled: top-k, min-p and top-p over the working row leave
 * cand[0..n) with unnormalised probabilities weight[0..n) (temperature
 * applied); returns n and their sum in *total. */
static size_t filter_row(cairn_sampler *s, double *total)
{
    const cairn_sampling_params *p = &s->params;
    const int n = s->n_vocab;
    const float *work = s->logits;
    /* cand[0..n_cand) are the surviving ids; `sorted` says whether they
     * are already best first. */
    size_t n_cand = (size_t)n;
    bool sorted = false;
    if (p->top_k > 0 && p->top_k < n) {
        select_best(work, NULL, (size_t)n, s->cand, (size_t)p->top_k);
        n_cand = (size_t)p->top_k;
        sorted = true;
    } else {
        for (int i = 0; i < n; i++)
            s->cand[i] = i;
    }

    int32_t best = s->cand[0];
    for (size_t i = 1; i < n_cand && !sorted; i++)
        if (ranks_before(work, s->cand[i], best))
            best = s->cand[i];
    const float best_logit = work[best]; /* finite: penalize() caps it */

    /* top-p's softmax covers every candidate top-k left, including those
     * min-p is about to drop, so its normalizer is taken now. */
    const bool want_top_p = p->top_p < 1.0f;
    double z = 0.0;
    if (want_top_p)
        for (size_t i = 0; i < n_cand; i++)
            z += exp((double)work[s->cand[i]] - (double)best_logit);

    if (p->min_p > 0.0f) {
        /* p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p).
         * Order-preserving, and the best token always stays. */
        const float min_logit = best_logit + logf(p->min_p);
        size_t kept = 0;
        for (size_t i = 0; i < n_cand; i++)
            if (work[s->cand[i]] >= min_logit)
                s->cand[kept++] = s->cand[i];
        n_cand = kept;
    }

    if (want_top_p)
        apply_top_p(s, &n_cand, sorted, best_logit, z);

    /* Temperature and softmax. */
    const double inv_t = 1.0 / (double)p->temperature;
    *total = 0.0;
    for (size_t i = 0; i < n_cand; i++) {
        double w = exp(((double)work[s->cand[i]] - (double)best_logit) * inv_t);
        s->weight[i] = w;
        *total += w;
    }
    return n_cand;
}

int cairn_sampler_sample(cairn_sampler *s, const float *logits, int32_t *token,
                         cairn_token_logprob *chosen, cairn_token_logprob *top)
{
    if (!s || !logits || !token)
        return CAIRN_EINVAL;
    double log_z = 0.0;
    int rc = prepare_row(s, logits, chosen || (top && s->params.n_logprobs > 0) ? &log_z : NULL,
                         top);
    if (rc != CAIRN_OK)
        return rc;

    int32_t picked;
    if (s->params.temperature <= 0.0f) {
        picked = row_argmax(s);
    } else {
        /* one draw by inverting the cumulative sum */
        double total;
        const size_t n_cand = filter_row(s, &total);
        const double u = cairn_rng_uniform(&s->rng) * total;
        picked = s->cand[n_cand - 1]; /* rounding can leave u at the very end */
        double cum = 0.0;
        for (size_t i = 0; i < n_cand; i++) {
            cum += s->weight[i];
            if (u < cum) {
                picked = s->cand[i];
                break;
            }
        }
    }

    *token = picked;
    if (chosen) {
        chosen->token = picked;
        chosen->logprob = isnan(logits[picked]) ? -INFINITY
                                                : (float)((double)logits[picked] - log_z);
    }
    return CAIRN_OK;
}

int cairn_sampler_probs(cairn_sampler *s, const float *logits, float *probs)
{
    if (!s || !logits || !probs)
        return CAIRN_EINVAL;
    int rc = prepare_row(s, logits, NULL, NULL);
    if (rc != CAIRN_OK)
        return rc;
    memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
    if (s->params.temperature <= 0.0f) {
        probs[row_argmax(s)] = 1.0f;
        return CAIRN_OK;
    }
    double total;
    const size_t n_cand = filter_row(s, &total);
    for (size_t i = 0; i < n_cand; i++)
        probs[s->cand[i]] = (float)(s->weight[i] / total);
    return CAIRN_OK;
}

/* ---- what a batched sampler reads (model/sample_batch.c) ---------------- */

const cairn_sampling_params *cairn_sampler_params(const cairn_sampler *s)
{
    return s ? &s->params : NULL;
}

int cairn_sampler_n_vocab(const cairn_sampler *s)
{
    return s ? s->n_vocab : 0;
}

int cairn_sampler_window(cairn_sampler *s, cairn_sample_penalty *out)
{
    if (!s || !out || !cairn_sampling_has_penalties(&s->params))
        return 0;
    const int cap = s->params.penalty_last_n;
    int n = 0;
    /* A token occurs count[t] times in the ring; its first occurrence
     * emits it and flips count[t] negative so the others are skipped, and
     * the second pass restores the counts. O(window), nothing allocated. */
    for (int i = 0; i < s->window_len; i++) {
        int32_t t = s->window[(s->window_head + i) % cap];
        if (s->count[t] <= 0)
            continue;
        out[n].token = t;
        out[n].count = s->count[t];
        out[n].bias = s->bias ? s->bias[t] : 0.0f;
        s->count[t] = -s->count[t];
        n++;
    }
    for (int i = 0; i < n; i++)
        s->count[out[i].token] = out[i].count;
    return n;
}

int cairn_sampler_bias_pairs(const cairn_sampler *s, cairn_sample_bias *out)
{
    if (!s || !out || !s->bias)
        return 0;
    const int n = s->params.n_logit_bias;
    for (int i = 0; i < n; i++) {
        const int32_t t = s->params.logit_bias[i].token;
        out[i].token = t;
        out[i].bias = s->bias[t]; /* the last listed bias of t, for every entry of t */
    }
    return n;
}

double cairn_sampler_peek_uniform(const cairn_sampler *s)
{
    cairn_rng copy = s->rng; /* the draw cairn_sampler_sample would make next */
    return cairn_rng_uniform(&copy);
}

void cairn_sampler_skip_uniform(cairn_sampler *s)
{
    if (s)
        (void)cairn_rng_uniform(&s->rng);
}
