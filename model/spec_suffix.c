/*
 * model/spec_suffix.c — suffix speculation: guesses copied from what the
 * engine has already seen. Agents, RAG and code editing repeat text: the
 * passage being quoted, the function being edited (in the request's own
 * context), and the tool call shaped like the last ten, the answer format,
 * the same task's answer in another session (in earlier requests of the
 * same tenant). When the last few tokens occurred before, what followed
 * them then, weighted by how often it followed, is the guess now.
 *
 *   request   ... a b c d e ........ a b c [pending = d]
 *   corpus    |x a b c d f ...|y z ...|... a b c d e ...|   (same tenant)
 *                   └ match ┘                └─ match ┘
 *   guesses   e (twice), f (once): a tree whose rows are the continuations,
 *             grown best-first by their share of the weight
 *
 * Where matches are found
 *   - the request's own tokens (prompt, history, what it generated): a scan
 *     from the newest position back, every occurrence of the last two
 *     tokens, each match extended backwards up to MATCH_MAX tokens;
 *   - the corpus: a ring of the tokens earlier requests of the spec brought
 *     in (their new prompt tokens and their outputs), each position tagged
 *     with its tenant. An index of hash chains, as a compressor keeps them,
 *     links every position to the previous one that ends with the same two
 *     tokens of the same tenant:
 *
 *        head[hash(tenant, t[p-1], t[p])] ──► p ──back[p]──► q ──► ... (0 ends)
 *
 *     A lookup follows at most WALK_MAX links; a link to a position the ring
 *     has overwritten ends the walk (positions are absolute, the ring slot is
 *     p % cap). Every candidate is checked token by token and by tenant, so
 *     a hash collision can cost a comparison but never show one tenant's
 *     text to another.
 *
 * Weighting. Of all occurrences, those whose match is at least
 * min(longest, ngram_max) tokens long count; each adds its match length to
 * every node of its continuation in a small trie. A row's score is the
 * product of its nodes' shares of their parents' weight (1 for a text seen
 * once, 1/6 for one of six different numbers that followed "index":).
 * Rows are added best first while the score is at least SCORE_MIN, at most
 * the controller's row budget, and no deeper than twice the longest match
 * (a two-token match guesses four tokens, an eight-token one sixteen): the
 * draft grows with the match and the controller shrinks it after rejections.
 *
 * Memory: cap tokens of corpus at 16 bytes each (token, tenant, link) plus
 * a head table of cap/2 buckets at 8 bytes: 20 MiB for the default 1 Mi
 * tokens, allocated when the first request retires. Requests are brought in
 * when they end (cairn_spec_seq_free): a request sees what ended before it
 * began drafting, never a running neighbour's tokens.
 *
 * Threads: like the rest of a cairn_spec, one thread drafts for all its
 * sequences (model.h), so the corpus takes no lock.
 */
#include "model/spec_impl.h"

#include <stdlib.h>
#include <string.h>

#define MATCH_MAX 32    /* tokens a match is compared over                  */
#define OCC_MAX 48      /* occurrences whose continuations are weighed      */
#define WALK_MAX 256    /* hash-chain links followed per corpus lookup      */
#define TRIE_MAX 768    /* continuation nodes per proposal                  */
#define CONTEXT_BEFORE 16 /* tokens before a retiring request's new ones   */
#define SCORE_MIN 0.2   /* rows less likely than this are not proposed      */
#define SEP (-1)        /* between corpus segments: no match crosses it     */

struct spec_suffix {
    int64_t cap;       /* corpus tokens (0: the request's own context only)  */
    int32_t *tok;      /* [cap] ring                                          */
    uint64_t *tenant;  /* [cap] whose token it is                             */
    uint32_t *back;    /* [cap] distance to the previous position with the
                          same anchor hash; 0 = none                          */
    int64_t *head;     /* [n_bucket] newest position + 1 per hash; 0 = none   */
    uint64_t bucket_mask;
    int64_t end;       /* positions written (absolute)                        */
};

typedef struct {
    spec_suffix *corpus;
    int ngram_min, ngram_max;
} suffix_state;

/* ---- the corpus ----------------------------------------------------------- */

int spec_suffix_create(int64_t cap, spec_suffix **out)
{
    if (cap < 0 || cap > ((int64_t)1 << 31))
        return CAIRN_EINVAL;
    spec_suffix *c = calloc(1, sizeof *c);
    if (!c)
        return CAIRN_ENOMEM;
    c->cap = cap;
    *out = c;
    return CAIRN_OK;
}

void spec_suffix_free(spec_suffix *c)
{
    if (!c)
        return;
    free(c->tok);
    free(c->tenant);
    free(c->back);
    free(c->head);
    free(c);
}

static uint64_t anchor_hash(uint64_t tenant, int32_t a, int32_t b)
{
    uint64_t h = tenant * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)(uint32_t)a * 0xC2B2AE3D27D4EB4Full;
    h = (h << 31 | h >> 33) * 0x165667B19E3779F9ull;
    h ^= (uint64_t)(uint32_t)b * 0x27D4EB2F165667C5ull;
    h ^= h >> 29;
    return h * 0x94D049BB133111EBull;
}

static int corpus_alloc(spec_suffix *c)
{
    uint64_t buckets = 1024;
    while (buckets < (uint64_t)c->cap / 2)
        buckets <<= 1;
    c->tok = malloc((size_t)c->cap * sizeof *c->tok);
    c->tenant = malloc((size_t)c->cap * sizeof *c->tenant);
    c->back = malloc((size_t)c->cap * sizeof *c->back);
    c->head = calloc((size_t)buckets, sizeof *c->head);
    if (!c->tok || !c->tenant || !c->back || !c->head) {
        free(c->tok), free(c->tenant), free(c->back), free(c->head);
        c->tok = NULL, c->tenant = NULL, c->back = NULL, c->head = NULL;
        return CAIRN_ENOMEM;
    }
    c->bucket_mask = buckets - 1;
    return CAIRN_OK;
}

/* Whether absolute position p is still in the ring. */
static bool corpus_holds(const spec_suffix *c, int64_t p)
{
    return p >= 0 && p < c->end && p >= c->end - c->cap;
}

static int32_t corpus_tok(const spec_suffix *c, int64_t p) { return c->tok[p % c->cap]; }

static void corpus_put(spec_suffix *c, uint64_t tenant, int32_t t)
{
    const int64_t p = c->end++;
    const int64_t slot = p % c->cap;
    c->tok[slot] = t;
    c->tenant[slot] = tenant;
    c->back[slot] = 0;
    if (t == SEP || p == 0 || !corpus_holds(c, p - 1))
        return;
    const int32_t prev = corpus_tok(c, p - 1);
    if (prev == SEP)
        return;
    int64_t *h = &c->head[anchor_hash(tenant, prev, t) & c->bucket_mask];
    if (*h > 0 && p - (*h - 1) <= UINT32_MAX)
        c->back[slot] = (uint32_t)(p - (*h - 1));
    *h = p + 1;
}

int spec_suffix_add(spec_suffix *c, uint64_t tenant, const int32_t *tokens, int n)
{
    if (!c || c->cap == 0 || n <= 0)
        return CAIRN_OK;
    if (!c->tok && corpus_alloc(c) != CAIRN_OK)
        return CAIRN_ENOMEM;
    if (c->end > 0)
        corpus_put(c, tenant, SEP);
    for (int i = 0; i < n; i++)
        corpus_put(c, tenant, tokens[i]);
    return CAIRN_OK;
}

int64_t spec_suffix_tokens(const spec_suffix *c)
{
    if (!c)
        return 0;
    return c->end < c->cap ? c->end : c->cap;
}

/* ---- finding occurrences ---------------------------------------------------- */

/* One earlier occurrence of the request's last tokens: its match length and
 * where its continuation starts (own context, or the corpus). */
typedef struct {
    int match;
    bool own;
    int64_t at;
} occurrence;

typedef struct {
    occurrence occ[OCC_MAX];
    int n;
    int longest;
} occ_set;

/* Keeps the OCC_MAX longest matches (ties: the one found first, the newest). */
static void occ_add(occ_set *s, int match, bool own, int64_t at)
{
    if (match > s->longest)
        s->longest = match;
    int i = s->n;
    if (s->n == OCC_MAX) {
        if (s->occ[OCC_MAX - 1].match >= match)
            return;
        i = OCC_MAX - 1;
    } else {
        s->n++;
    }
    while (i > 0 && s->occ[i - 1].match < match) {
        s->occ[i] = s->occ[i - 1];
        i--;
    }
    s->occ[i] = (occurrence){match, own, at};
}

/* Occurrences in the request itself: h[0 .. N) with h[N-1] the pending
 * token; an occurrence ends at p < N-1 (so something followed it). */
static void find_own(const int32_t *h, int N, int min_match, occ_set *s)
{
    if (N < 2)
        return;
    const int32_t last = h[N - 1];
    for (int p = N - 2; p >= 0; p--) {
        if (h[p] != last)
            continue;
        int m = 1;
        while (m < MATCH_MAX && p - m >= 0 && h[p - m] == h[N - 1 - m])
            m++;
        if (m < min_match)
            continue;
        occ_add(s, m, true, p + 1);
    }
}

/* Occurrences in the tenant's part of the corpus. */
static void find_corpus(const spec_suffix *c, uint64_t tenant, const int32_t *h, int N,
                        int min_match, occ_set *s)
{
    if (!c || !c->tok || N < 2)
        return;
    const int32_t last = h[N - 1], before = h[N - 2];
    int64_t head = c->head[anchor_hash(tenant, before, last) & c->bucket_mask];
    int64_t p = head - 1;
    for (int walk = 0; walk < WALK_MAX && head > 0 && corpus_holds(c, p); walk++) {
        const int64_t slot = p % c->cap;
        if (c->tenant[slot] == tenant && c->tok[slot] == last && corpus_holds(c, p + 1) &&
            corpus_tok(c, p + 1) != SEP) {
            int m = 0;
            while (m < MATCH_MAX && m < N && corpus_holds(c, p - m) &&
                   c->tenant[(p - m) % c->cap] == tenant && corpus_tok(c, p - m) == h[N - 1 - m])
                m++;
            if (m >= min_match && m >= 2)
                occ_add(s, m, false, p + 1);
        }
        const uint32_t d = c->back[slot];
        if (d == 0)
            break;
        p -= d;
    }
}

/* ---- weighing continuations --------------------------------------------- */

typedef struct {
    int32_t tok;
    int parent;   /* node index, -1 under the root */
    int child;    /* first child, -1 none */
    int sibling;  /* next sibling, -1 none */
    int depth;    /* 1 for the root's children */
    double weight;
    double score; /* product of shares along the path */
    int row;      /* its tree row once proposed, -1 before */
} trie_node;

typedef struct {
    trie_node node[TRIE_MAX];
    int n;
    int root_child;
    double root_weight;
} trie;

static int trie_child(trie *t, int parent, int32_t tok, int depth)
{
    int *first = parent < 0 ? &t->root_child : &t->node[parent].child;
    for (int c = *first; c >= 0; c = t->node[c].sibling)
        if (t->node[c].tok == tok)
            return c;
    if (t->n == TRIE_MAX)
        return -1;
    const int c = t->n++;
    t->node[c] = (trie_node){.tok = tok, .parent = parent, .child = -1, .sibling = *first,
                             .depth = depth, .row = -1};
    *first = c;
    return c;
}

static int suffix_seq_create(void *method, const cairn_spec_params *p,
                             const cairn_sampling_params *sp, void **state)
{
    (void)sp;
    suffix_state *g = calloc(1, sizeof *g);
    if (!g)
        return CAIRN_ENOMEM;
    g->corpus = method;
    g->ngram_min = p->ngram_min;
    g->ngram_max = p->ngram_max;
    *state = g;
    return CAIRN_OK;
}

static void suffix_seq_free(void *state) { free(state); }

static int suffix_propose(void *state, const spec_view *v, spec_tree *t, int budget, int source)
{
    const suffix_state *g = state;
    const int32_t *h = v->tokens;
    const int N = v->n_past + 1; /* the pending token included */
    int rows = v->chain_len < budget ? v->chain_len : budget;
    if (rows <= 0 || N < 2)
        return CAIRN_OK;

    occ_set occ = {.n = 0, .longest = 0};
    find_own(h, N, g->ngram_min, &occ);
    find_corpus(g->corpus, v->tenant, h, N, g->ngram_min, &occ);
    if (occ.n == 0)
        return CAIRN_OK;
    const int floor = occ.longest < g->ngram_max ? occ.longest : g->ngram_max;
    int depth_max = 2 * occ.longest;
    if (depth_max > SPEC_MAX_DEPTH)
        depth_max = SPEC_MAX_DEPTH;
    if (depth_max > rows)
        depth_max = rows;

    /* the continuations, weighted by their match lengths */
    static _Thread_local trie tr;
    tr.n = 0;
    tr.root_child = -1;
    tr.root_weight = 0;
    for (int i = 0; i < occ.n && occ.occ[i].match >= floor; i++) {
        const occurrence *o = &occ.occ[i];
        const double w = o->match;
        tr.root_weight += w;
        int parent = -1;
        for (int d = 0; d < depth_max; d++) {
            int32_t tok;
            if (o->own) {
                if (o->at + d >= N)
                    break;
                tok = h[o->at + d];
            } else {
                if (!corpus_holds(g->corpus, o->at + d) ||
                    (tok = corpus_tok(g->corpus, o->at + d)) == SEP)
                    break;
            }
            const int c = trie_child(&tr, parent, tok, d + 1);
            if (c < 0)
                break;
            tr.node[c].weight += w;
            parent = c;
        }
    }
    for (int c = 0; c < tr.n; c++) { /* parents come before children */
        const trie_node *p = tr.node[c].parent >= 0 ? &tr.node[tr.node[c].parent] : NULL;
        tr.node[c].score = (p ? p->score : 1.0) * tr.node[c].weight /
                           (p ? p->weight : tr.root_weight);
    }

    /* rows best first: a node joins once its parent did */
    for (int added = 0; added < rows;) {
        int best = -1;
        for (int c = 0; c < tr.n; c++) {
            const trie_node *n = &tr.node[c];
            if (n->row >= 0 || n->score < SCORE_MIN)
                continue;
            if (n->parent >= 0 && tr.node[n->parent].row < 0)
                continue;
            if (best < 0 || n->score > tr.node[best].score)
                best = c;
        }
        if (best < 0)
            break;
        trie_node *n = &tr.node[best];
        const int parent_row = n->parent >= 0 ? tr.node[n->parent].row : 0;
        const int before = t->n;
        const int r = spec_tree_add(t, parent_row, n->tok, source);
        if (r < 0) {
            n->score = 0; /* the tree is full or too deep there */
            if (t->n >= t->cap)
                break;
            continue;
        }
        n->row = r;
        added += t->n - before;
    }
    return CAIRN_OK;
}

/* A request ends: its new tokens (with a little context before them) join
 * the corpus under its tenant. */
static int suffix_retire(void *state, const spec_view *v, int first_new)
{
    const suffix_state *g = state;
    if (!g->corpus || g->corpus->cap == 0)
        return CAIRN_OK;
    int from = first_new - CONTEXT_BEFORE;
    if (from < 0)
        from = 0;
    /* at most the ring, the newest tokens */
    if ((int64_t)(v->n_known - from) > g->corpus->cap / 2)
        from = v->n_known - (int)(g->corpus->cap / 2);
    return spec_suffix_add(g->corpus, v->tenant, v->tokens + from, v->n_known - from);
}

static void suffix_method_free(void *method) { spec_suffix_free(method); }

const spec_drafter_ops spec_suffix_ops = {
    .name = "suffix",
    .needs_features = false,
    .seq_create = suffix_seq_create,
    .seq_free = suffix_seq_free,
    .propose = suffix_propose,
    .retire = suffix_retire,
    .method_free = suffix_method_free,
};
